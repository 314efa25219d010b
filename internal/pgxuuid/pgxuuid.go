// Package pgxuuid lets pgx send github.com/google/uuid's UUID as
// Postgres's uuid in binary. Without it pgx takes a uuid.UUID as a
// driver.Valuer: every id of every statement (a batch of route events
// carries several per row) is formatted as text, with allocations, for
// Postgres to parse back. Reading is left as it is (uuid.UUID's
// sql.Scanner, which also reads NULL as uuid.Nil).
package pgxuuid

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ParseConfig is pgxpool.ParseConfig with the codec registered on every
// connection: how every weir pool is configured.
func ParseConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.AfterConnect = AfterConnect
	return cfg, nil
}

// AfterConnect registers the codec on a new connection: a
// pgxpool.Config's AfterConnect.
func AfterConnect(_ context.Context, c *pgx.Conn) error {
	Register(c.TypeMap())
	return nil
}

// Register makes m encode uuid.UUID natively.
func Register(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{wrapEncode}, m.TryWrapEncodePlanFuncs...)
}

// value is a uuid.UUID as pgtype's UUID codec takes it.
type value uuid.UUID

func (v value) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: v, Valid: true}, nil }

func wrapEncode(v any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if u, ok := v.(uuid.UUID); ok {
		return &encodePlan{}, value(u), true
	}
	return nil, nil, false
}

type encodePlan struct{ next pgtype.EncodePlan }

func (p *encodePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *encodePlan) Encode(v any, buf []byte) ([]byte, error) {
	return p.next.Encode(value(v.(uuid.UUID)), buf)
}
