-- The ten pickup zones that took the most money, with their borough and zone names: a join of the trips
-- to the 265-row `zones` lookup (LEFT JOIN: an id missing from the lookup keeps its trips, with null names).
-- Revenue is an exact DECIMAL sum; equal revenues are ordered by zone id.
SELECT t.pu_location_id AS location_id,
       z.borough,
       z.zone,
       count(*) AS trips,
       sum(CAST(t.total_amount AS DECIMAL(18, 2))) AS revenue
FROM trips AS t
LEFT JOIN zones AS z ON z.location_id = t.pu_location_id
GROUP BY t.pu_location_id, z.borough, z.zone
ORDER BY revenue DESC, location_id
LIMIT 10;
