-- Monthly revenue by borough, read from another dynamic table (daily_revenue_by_borough, whose lag is DOWNSTREAM:
-- the scheduler refreshes it first whenever this one is due).
-- How it refreshes: the daily table's own refresh replaces the groups it touched (its change feed holds deletes
-- and inserts), so this one recomputes the months those rows belong to, and only those.
CREATE OR REPLACE DYNAMIC TABLE main.monthly_revenue_by_borough
  TARGET_LAG = '1 hour'
  REFRESH_MODE = INCREMENTAL  -- always incremental; without it ADAPTIVE may recompute a large change in full
AS
SELECT date_trunc('month', pickup_date)::DATE AS month,
       borough,
       sum(trips)   AS trips,
       sum(revenue) AS revenue,
       sum(tips)    AS tips
FROM daily_revenue_by_borough
GROUP BY ALL;
