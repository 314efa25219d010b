-- name: RecordAuditEvent :exec
INSERT INTO audit_events (at, actor, credential, procedure, target, summary, outcome, peer)
VALUES (@at, @actor, @credential, @procedure, @target, @summary, @outcome, @peer);

-- name: ListAuditEvents :many
-- Newest first; a page continues strictly after (before_at, before_id).
SELECT * FROM audit_events
WHERE (sqlc.narg('since')::timestamptz IS NULL OR at >= sqlc.narg('since'))
  AND (sqlc.narg('until')::timestamptz IS NULL OR at < sqlc.narg('until'))
  AND (sqlc.narg('actor')::text IS NULL OR actor = sqlc.narg('actor'))
  AND (sqlc.narg('procedure')::text IS NULL OR procedure = sqlc.narg('procedure')
       OR procedure LIKE '%/' || sqlc.narg('procedure'))
  AND (cardinality(@targets::text[]) = 0 OR target = ANY(@targets::text[])
       OR split_part(target, ' (', 1) = ANY(@targets::text[])
       OR (target LIKE '% (%)' AND substring(target FROM ' \((.*)\)$') = ANY(@targets::text[])))
  AND (sqlc.narg('before_id')::bigint IS NULL
       OR (at, id) < (sqlc.narg('before_at')::timestamptz, sqlc.narg('before_id')::bigint))
ORDER BY at DESC, id DESC
LIMIT @max_rows;
