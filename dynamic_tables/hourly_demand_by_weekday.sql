-- Hourly demand by weekday, month by month: trips and passengers per (month, weekday, hour), and the longest trip.
-- How it refreshes: a new month adds its own groups (merged: SUM, COUNT and MAX need only the new rows); a
-- month loaded again recomputes that month's groups only (about a quarter of the table after four months).
CREATE OR REPLACE DYNAMIC TABLE main.hourly_demand_by_weekday
  TARGET_LAG = '1 hour'
  REFRESH_MODE = INCREMENTAL  -- always incremental; without it ADAPTIVE may recompute a large change in full
AS
SELECT pickup_year,
       pickup_month,
       pickup_weekday,
       pickup_hour,
       count(*)             AS trips,
       sum(passenger_count) AS passengers,
       max(trip_distance)   AS longest_mi
FROM trips
GROUP BY ALL;
