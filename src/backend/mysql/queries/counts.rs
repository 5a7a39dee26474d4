//! The statement `counts.rs` runs for jobs moved to history, rendered with
//! the others once at connect, below the file that runs it.

/// As SQLite's `COUNT_MANY`: the history rows whose ids are the JSON array
/// `:ids`. Differs in that `ON DUPLICATE KEY` stands for `ON CONFLICT`, the
/// ids drive the join on the primary key (as every `JSON_TABLE` join of
/// `templates.rs`), and rows go in key order, so two transactions counting
/// into the same buckets lock them in the same order.
pub const COUNT_MOVED: &str = "
INSERT INTO {finished_counts} (span, bucket, queue, kind, status, n)
SELECT s.span, h.finished_at - h.finished_at % (s.span * 1000000), h.queue, h.kind, h.status,
       COUNT(*)
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS m
STRAIGHT_JOIN {history} AS h FORCE INDEX (PRIMARY) ON h.id = m.id
CROSS JOIN (SELECT 60 AS span UNION ALL SELECT 3600) AS s
GROUP BY 1, 2, 3, 4, 5
ORDER BY 1, 2, 3, 4, 5
ON DUPLICATE KEY UPDATE n = n + VALUES(n)";
