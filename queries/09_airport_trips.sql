-- Airport trips, chosen by ZONE: a pickup or a dropoff at JFK (zone 132), LaGuardia (138) or Newark (1).
-- A trip between two airports counts once at each end. The rate code is not used to select: flat_rate_trips
-- shows how many of them carry ratecode_id 2 (JFK flat fare) or 3 (Newark). Money: exact DECIMAL sums.
WITH legs AS (
    SELECT pu_location_id AS location_id, 'pickup' AS leg, ratecode_id, trip_distance, total_amount
    FROM trips WHERE pu_location_id IN (1, 132, 138)
    UNION ALL
    SELECT do_location_id AS location_id, 'dropoff' AS leg, ratecode_id, trip_distance, total_amount
    FROM trips WHERE do_location_id IN (1, 132, 138)
)
SELECT CASE location_id WHEN 132 THEN 'JFK' WHEN 138 THEN 'LGA' WHEN 1 THEN 'EWR' END AS airport,
       leg,
       count(*) AS trips,
       count(*) FILTER (WHERE ratecode_id IN (2, 3)) AS flat_rate_trips,
       round(avg(CAST(trip_distance AS DECIMAL(18, 2))), 2) AS avg_distance_miles,
       sum(CAST(total_amount AS DECIMAL(18, 2))) AS revenue
FROM legs
GROUP BY airport, leg
ORDER BY airport, leg;
