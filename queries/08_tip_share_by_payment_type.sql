-- Tips by payment type: tips are recorded for card (and Flex Fare app) payments only, cash tips never reach
-- the record, so "cash riders don't tip" is an artefact of the data. Shows CASE for code labels and FILTER.
-- Money is summed as exact DECIMAL; the percentages are rounded to 2 decimals.
SELECT payment_type,
       CASE payment_type
           WHEN 0 THEN 'Flex Fare' WHEN 1 THEN 'Credit card' WHEN 2 THEN 'Cash' WHEN 3 THEN 'No charge'
           WHEN 4 THEN 'Dispute' WHEN 5 THEN 'Unknown' WHEN 6 THEN 'Voided'
       END AS payment,
       count(*) AS trips,
       sum(CAST(tip_amount AS DECIMAL(18, 2))) AS tips,
       round(100 * sum(CAST(tip_amount AS DECIMAL(18, 2)))
                 / nullif(sum(CAST(total_amount AS DECIMAL(18, 2))), 0), 2) AS tip_pct_of_total,
       round(100.0 * count(*) FILTER (WHERE tip_amount > 0) / count(*), 2) AS pct_trips_tipped
FROM trips
GROUP BY payment_type
ORDER BY payment_type NULLS FIRST;
