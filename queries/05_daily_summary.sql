-- A daily summary: trips, average distance, average and total amount per pickup date (the NYC wall-clock
-- date the meter started). Distances and money are cast to DECIMAL(18, 2) before they are summed or
-- averaged (exact in any order), and averages are rounded to 2 decimals.
SELECT pickup_date,
       count(*) AS trips,
       round(avg(CAST(trip_distance AS DECIMAL(18, 2))), 2) AS avg_distance_miles,
       round(avg(CAST(total_amount AS DECIMAL(18, 2))), 2) AS avg_total_amount,
       sum(CAST(total_amount AS DECIMAL(18, 2))) AS total_amount
FROM trips
GROUP BY pickup_date
ORDER BY pickup_date;
