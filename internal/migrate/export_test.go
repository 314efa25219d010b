package migrate

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ApplyOwnBefore applies weir's own migrations numbered below version on
// conn, and ApplyOwn all of them: tests build an older schema with the
// one, fill it, and migrate it with the other.
func ApplyOwnBefore(ctx context.Context, conn *pgx.Conn, version int) error {
	all, _, err := load()
	if err != nil {
		return err
	}
	var before []migration
	for _, m := range all {
		if m.version < version {
			before = append(before, m)
		}
	}
	return applyOwn(ctx, conn, before)
}

// ApplyOwn applies weir's own migrations not applied yet on conn.
func ApplyOwn(ctx context.Context, conn *pgx.Conn) error {
	all, _, err := load()
	if err != nil {
		return err
	}
	return applyOwn(ctx, conn, all)
}
