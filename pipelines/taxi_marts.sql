-- The taxi marts: tables a learner wants from `trips` and `zones`, built as a DAG on the worker plane.
--   python ducklake_test.py pipeline plan pipelines/taxi_marts.sql     (the waves and edges; runs nothing)
--   python ducklake_test.py pipeline run pipelines/taxi_marts.sql      (each node on a worker, as soon as it can)
--   python ducklake_test.py pipeline lineage marts.borough_summary --columns
-- Headers say what each statement is and what it needs; the kit also infers dependencies from the tables each
-- statement reads, and warns when a header leaves one out. `-- audit:` checks the table a node builds, in its
-- transaction: a failed audit rolls the node back and skips what depends on it. Money is summed as
-- DECIMAL(18, 2): exact, so that `all` can compare every mart with the same figure computed directly from `trips`.

-- id: schema
-- description: the schema the marts live in
CREATE SCHEMA IF NOT EXISTS marts;

-- id: zone_names
-- node: w1
-- description: a worker-local copy of the zone names on w1, for the flows below
CREATE OR REPLACE TABLE local.zone_names AS
SELECT location_id, borough || ' / ' || zone AS name FROM zones;

-- id: daily_revenue
-- depends_on: schema
-- description: trips and revenue per day and pickup borough (a join with zones)
-- audit: row_count > 0
CREATE OR REPLACE TABLE marts.daily_revenue AS
SELECT t.pickup_date, z.borough, count(*) AS trips, sum(t.total_amount::DECIMAL(18, 2)) AS revenue
FROM trips t JOIN zones z ON z.location_id = t.pu_location_id
GROUP BY t.pickup_date, z.borough;

-- id: hourly_demand
-- depends_on: schema
-- description: trips per weekday and hour, with their total duration
CREATE OR REPLACE TABLE marts.hourly_demand AS
SELECT pickup_weekday, pickup_hour, count(*) AS trips, sum(trip_duration_s) AS duration_s
FROM trips
GROUP BY pickup_weekday, pickup_hour;

-- id: airport_trips
-- depends_on: schema
-- description: trips that start or end at an airport (a CTE and a subquery)
CREATE OR REPLACE TABLE marts.airport_trips AS
WITH airports AS (
    SELECT location_id FROM zones WHERE service_zone IN ('Airports', 'EWR')
)
SELECT pu_borough AS borough, pickup_date, count(*) AS trips, sum(fare_amount::DECIMAL(18, 2)) AS fares
FROM trips
WHERE pu_location_id IN (SELECT location_id FROM airports)
   OR do_location_id IN (SELECT location_id FROM airports)
GROUP BY pu_borough, pickup_date;

-- id: zone_flows
-- depends_on: schema, zone_names
-- description: zone-to-zone flows, named with w1's worker-local zone names (so it runs on w1)
CREATE OR REPLACE TABLE marts.zone_flows AS
SELECT pu.name AS from_zone, dropoff.name AS to_zone, count(*) AS trips
FROM trips t
JOIN local.zone_names pu ON pu.location_id = t.pu_location_id
JOIN local.zone_names dropoff ON dropoff.location_id = t.do_location_id
GROUP BY pu.name, dropoff.name;

-- id: borough_summary
-- depends_on: daily_revenue, airport_trips
-- description: per borough: trips, revenue and the share of airport trips (joins two marts)
-- audit: unique(borough), row_count > 0
CREATE OR REPLACE TABLE marts.borough_summary AS
SELECT r.borough, r.trips, r.revenue, coalesce(a.trips, 0) AS airport_trips,
       round(coalesce(a.trips, 0) / r.trips, 4) AS airport_share
FROM (SELECT borough, sum(trips) AS trips, sum(revenue) AS revenue FROM marts.daily_revenue GROUP BY borough) r
LEFT JOIN (SELECT borough, sum(trips) AS trips FROM marts.airport_trips GROUP BY borough) a USING (borough);

-- id: drop_zone_names
-- depends_on: zone_flows
-- node: w1
-- description: the worker-local copy is not needed once the flows are built (it lives in w1's memory)
DROP TABLE local.zone_names;
