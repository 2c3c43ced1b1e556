-- Classic Q3: trips per passenger count and year. `pickup_year` is a partition key of `trips`
-- (PARTITIONED BY pickup_year, pickup_month), so the year comes from the lake's layout, not from
-- parsing each pickup timestamp.
SELECT passenger_count,
       pickup_year,
       count(*) AS trips
FROM trips
GROUP BY passenger_count, pickup_year
ORDER BY pickup_year, passenger_count NULLS FIRST;
