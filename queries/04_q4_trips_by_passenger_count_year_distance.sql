-- Classic Q4: trips per passenger count, year and distance rounded to whole miles, busiest first within
-- each year. The heaviest of the four: three grouping keys and a sort. Ties in the trip count are broken
-- by the keys, so the order is fully determined.
SELECT passenger_count,
       pickup_year,
       CAST(round(trip_distance) AS INTEGER) AS distance_miles,
       count(*) AS trips
FROM trips
GROUP BY passenger_count, pickup_year, distance_miles
ORDER BY pickup_year, trips DESC, passenger_count NULLS FIRST, distance_miles;
