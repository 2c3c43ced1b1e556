-- Daily revenue by pickup borough: trips joined with the zone each starts in (an inner join of two lake tables).
-- Money is summed as DECIMAL, so an incremental refresh and a full recompute agree to the cent.
-- How it refreshes: a new month's trips are only inserts, merged into their (day, borough) groups without reading
-- the older trips; other changes (a month replaced, a zone renamed) recompute only the groups they touch.
CREATE OR REPLACE DYNAMIC TABLE main.daily_revenue_by_borough
  TARGET_LAG = DOWNSTREAM  -- refreshed when monthly_revenue_by_borough, which reads it, is
  REFRESH_MODE = INCREMENTAL  -- always incremental; without it ADAPTIVE may recompute a large change in full
AS
SELECT t.pickup_date,
       z.borough,
       count(*)                              AS trips,
       sum(t.total_amount::DECIMAL(18, 2))   AS revenue,
       sum(t.tip_amount::DECIMAL(18, 2))     AS tips
FROM trips AS t
JOIN zones AS z ON t.pu_location_id = z.location_id
GROUP BY t.pickup_date, z.borough;
