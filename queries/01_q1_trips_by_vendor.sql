-- Classic taxi benchmark Q1, adapted to the yellow schema: trips per vendor (the original grouped by cab type).
-- One GROUP BY over every partition of `trips`; DuckDB reads only the vendor_id column of each Parquet file.
-- Vendors: 1 Creative Mobile Technologies, 2 Curb Mobility, 6 Myle Technologies, 7 Helix.
SELECT vendor_id,
       count(*) AS trips
FROM trips
GROUP BY vendor_id
ORDER BY vendor_id NULLS FIRST;
