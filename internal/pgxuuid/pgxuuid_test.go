package pgxuuid_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/pgxuuid"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Against a real Postgres, with and without Register: ids and arrays of
// ids arrive as the same uuid values and read back equal, NULL reads into
// uuid.NullUUID and is refused by uuid.UUID, and the text form Postgres
// prints is the one uuid.UUID.String gives.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	url := pgtest.NewURL(t)
	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.Nil}
	for _, registered := range []bool{false, true} {
		conn, err := pgx.Connect(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if registered {
			pgxuuid.Register(conn.TypeMap())
		}
		var one uuid.UUID
		var many []uuid.UUID
		var text string
		if err := conn.QueryRow(t.Context(), "SELECT $1::uuid, $2::uuid[], $1::uuid::text", ids[0], ids).Scan(&one, &many, &text); err != nil {
			t.Fatalf("registered %v: %v", registered, err)
		}
		if one != ids[0] || !slices.Equal(many, ids) || text != ids[0].String() {
			t.Errorf("registered %v: %v %v %q, want %v %v", registered, one, many, text, ids[0], ids)
		}
		var null uuid.NullUUID
		if err := conn.QueryRow(t.Context(), "SELECT NULL::uuid").Scan(&null); err != nil || null.Valid {
			t.Errorf("registered %v: NULL into NullUUID: %v %v", registered, null, err)
		}
		if err := conn.QueryRow(t.Context(), "SELECT NULL::uuid").Scan(&one); err != nil || one != ids[0] {
			t.Errorf("registered %v: NULL into uuid.UUID: %v %v, want it unchanged", registered, one, err)
		}
	}
}

// BenchmarkEncodeIDs: a batch's column of 100 ids, as pgx encodes it for
// the wire, with and without Register.
func BenchmarkEncodeIDs(b *testing.B) {
	ids := make([]uuid.UUID, 100)
	for i := range ids {
		ids[i] = uuid.New()
	}
	for _, registered := range []bool{false, true} {
		name := "valuer"
		if registered {
			name = "registered"
		}
		b.Run(name, func(b *testing.B) {
			m := pgtype.NewMap()
			if registered {
				pgxuuid.Register(m)
			}
			var buf []byte
			for b.Loop() {
				var err error
				if buf, err = m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
