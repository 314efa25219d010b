// Package migrations embeds weir's SQL migrations, applied in file-name
// order by internal/migrate.
package migrations

import "embed"

// FS holds the migration files, named NNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
