-- Merges a gate into the account's row for the family. A live deadline is
-- never shortened (the later deadline wins, with its evidence); an expired
-- row is simply replaced. Returns the gate in force afterwards.
-- name: WriteFamilyGate :one
INSERT INTO family_gates AS g (account_id, family, until, written_at, evidence)
VALUES (@account_id, @family, @until, @now, @evidence)
ON CONFLICT (account_id, family) DO UPDATE SET
    until = CASE WHEN g.until <= EXCLUDED.written_at OR EXCLUDED.until >= g.until
                 THEN EXCLUDED.until ELSE g.until END,
    evidence = CASE WHEN g.until <= EXCLUDED.written_at OR EXCLUDED.until >= g.until
                    THEN EXCLUDED.evidence ELSE g.evidence END,
    written_at = EXCLUDED.written_at
RETURNING *;

-- name: LiveFamilyGates :many
SELECT * FROM family_gates WHERE until > @now ORDER BY account_id, family;

-- name: ClearFamilyGates :execrows
DELETE FROM family_gates WHERE account_id = @account_id;
