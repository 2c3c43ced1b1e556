-- When people ride: trips per ISO weekday (1 Monday .. 7 Sunday) and hour of pickup (0..23), and each
-- hour's share of its weekday. Shows a window function over an aggregate: sum(count(*)) OVER (PARTITION BY ...).
-- The share is rounded to 2 decimals; it is computed from exact integer counts.
SELECT pickup_weekday,
       dayname(pickup_date) AS weekday,
       pickup_hour,
       count(*) AS trips,
       round(100.0 * count(*) / sum(count(*)) OVER (PARTITION BY pickup_weekday), 2) AS pct_of_weekday
FROM trips
GROUP BY pickup_weekday, weekday, pickup_hour
ORDER BY pickup_weekday, pickup_hour;
