// Package functions embeds the SQL functions weir defines in one file each
// rather than in a numbered migration: internal/migrate applies each file,
// after the migrations, whenever its text differs from what the database
// last applied. A function whose definition changes as the code does lives
// here, so that its current text is in one place.
package functions

import "embed"

// FS holds one file per function, named after it: weir_claim_lease.sql
// defines weir_claim_lease.
//
//go:embed *.sql
var FS embed.FS
