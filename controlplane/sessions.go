package controlplane

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/controlplane/dashboard"
	"github.com/weirhq/weir/controlplane/db"
)

// sessionStore keeps the dashboard's sessions in dashboard_sessions.
type sessionStore struct{ q *db.Queries }

func (s sessionStore) CreateSession(ctx context.Context, st dashboard.StoredSession) error {
	// Sign-ins are rare: each sweeps the expired rows.
	if err := s.q.DeleteExpiredDashboardSessions(ctx, st.Created); err != nil {
		return err
	}
	return s.q.CreateDashboardSession(ctx, db.CreateDashboardSessionParams{IDHash: st.IDHash, Person: st.Person,
		Credential: st.Credential, CreatedAt: st.Created, ExpiresAt: st.Expires})
}

func (s sessionStore) LookupSession(ctx context.Context, idHash []byte, now time.Time) (dashboard.StoredSession, error) {
	row, err := s.q.GetDashboardSession(ctx, db.GetDashboardSessionParams{IDHash: idHash, Now: now})
	if errors.Is(err, pgx.ErrNoRows) {
		return dashboard.StoredSession{}, dashboard.ErrNoSession
	}
	if err != nil {
		return dashboard.StoredSession{}, err
	}
	return dashboard.StoredSession{IDHash: idHash, Person: row.Person, Credential: row.Credential, Expires: row.ExpiresAt}, nil
}

func (s sessionStore) RevokeSession(ctx context.Context, idHash []byte, now time.Time) error {
	return s.q.RevokeDashboardSession(ctx, db.RevokeDashboardSessionParams{IDHash: idHash, Now: &now})
}
