-- Classic Q2: the average amount charged per passenger count. passenger_count is driver-entered and null
-- in the Flex Fare block, so NULL is a group of its own. Money is averaged as DECIMAL cents (an exact sum in
-- any order) and rounded to cents, so the answer is identical on every run and can be checked exactly.
SELECT passenger_count,
       count(*) AS trips,
       round(avg(CAST(total_amount AS DECIMAL(18, 2))), 2) AS avg_total_amount
FROM trips
GROUP BY passenger_count
ORDER BY passenger_count NULLS FIRST;
