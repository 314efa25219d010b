package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/randid"
)

// clientKeyPrefix marks weir's client keys so they are recognisable in a
// config file or a leak scanner.
const clientKeyPrefix = "weir_sk_"

// keyRestrictionNames are UpdateKey's mask paths, as errors list them.
const keyRestrictionNames = "allowed_models, pinned_accounts, rate_limit_per_minute, metered_accounts, team, budgets"

type keyService struct {
	weirv1connect.UnimplementedKeyServiceHandler
	store
	now   func() time.Time
	log   *slog.Logger
	watch *poolWatch
}

// HashKey is how client keys are stored and looked up: hex SHA-256. The
// data plane hashes before it asks, so a key's secret never leaves it.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func newKeySecret() string {
	return clientKeyPrefix + randid.Hex(32)
}

func (k keyService) CreateKey(ctx context.Context, req *connect.Request[weirv1.CreateKeyRequest]) (*connect.Response[weirv1.CreateKeyResponse], error) {
	m := req.Msg
	name := m.Name
	if name == "" || len(name) > 64 || strings.TrimSpace(name) != name {
		return nil, invalidf("name: required, at most 64 characters, no surrounding spaces")
	}
	if _, err := uuid.Parse(name); err == nil {
		return nil, invalidf("name: must not look like a key id")
	}
	models, err := validModels(m.AllowedModels)
	if err != nil {
		return nil, err
	}
	rate, err := validRateLimit(m.RateLimitPerMinute)
	if err != nil {
		return nil, err
	}
	metered, err := validMetered(m.MeteredAccounts)
	if err != nil {
		return nil, err
	}
	pins, err := k.resolvePins(ctx, m.PinnedAccounts)
	if err != nil {
		return nil, err
	}
	budgets, err := validBudgets("budgets", m.GetBudgets())
	if err != nil {
		return nil, err
	}
	var team uuid.NullUUID
	if m.GetTeam() != "" {
		t, err := k.findTeam(ctx, m.GetTeam())
		if err != nil {
			return nil, err
		}
		team = uuid.NullUUID{UUID: t.ID, Valid: true}
	}
	secret := newKeySecret()
	var row db.ClientKey
	err = k.tx(ctx, func(q *db.Queries) error {
		if row, err = q.CreateKey(ctx, db.CreateKeyParams{
			Name:               name,
			KeyHash:            HashKey(secret),
			Prefix:             secret[:len(clientKeyPrefix)+6],
			Now:                k.now(),
			AllowedModels:      models,
			Pinned:             len(pins) > 0,
			RateLimitPerMinute: rate,
			MeteredAccounts:    metered,
		}); err != nil {
			return storeErr(err)
		}
		if err := q.AddKeyAccounts(ctx, db.AddKeyAccountsParams{KeyID: row.ID, AccountIds: pins}); err != nil {
			return err
		}
		if !team.Valid && len(budgets) == 0 {
			return nil
		}
		if err := q.SetKeyTeam(ctx, db.SetKeyTeamParams{ID: row.ID, TeamID: team}); err != nil {
			return err
		}
		if err := setBudgets(ctx, q, uuid.NullUUID{UUID: row.ID, Valid: true}, uuid.NullUUID{}, budgets, k.now()); err != nil {
			return err
		}
		row, err = q.GetKey(ctx, row.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	k.log.InfoContext(ctx, "client key created", "key_id", row.ID, "name", row.Name)
	out, err := k.keyProtos(ctx, k.now(), []db.ClientKey{row})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.CreateKeyResponse{Key: out[0], Secret: secret}), nil
}

// UpdateKey sets or clears the restrictions the mask names, in one
// transaction. The triggers of 0015_key_limits.sql tell every worker; the
// call returns once this replica's streams were sent it.
func (k keyService) UpdateKey(ctx context.Context, req *connect.Request[weirv1.UpdateKeyRequest]) (*connect.Response[weirv1.UpdateKeyResponse], error) { //nolint:gocognit // the update mask applied field by field, each field a small case of its own
	m := req.Msg
	row, err := k.findKey(ctx, m.Id)
	if err != nil {
		return nil, err
	}
	paths := m.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidf("update_mask: name at least one of %s", keyRestrictionNames)
	}
	p := db.UpdateKeyLimitsParams{ID: row.ID}
	var pins []uuid.UUID
	var budgets []storedBudget
	var team uuid.NullUUID
	setTeam, setBudget := false, false
	for _, path := range paths {
		switch path {
		case "team":
			setTeam = true
			if m.GetTeam() != "" {
				t, err := k.findTeam(ctx, m.GetTeam())
				if err != nil {
					return nil, err
				}
				team = uuid.NullUUID{UUID: t.ID, Valid: true}
			}
		case "budgets":
			setBudget = true
			if budgets, err = validBudgets("budgets", m.GetBudgets()); err != nil {
				return nil, err
			}
		case "allowed_models":
			if p.AllowedModels, err = validModels(m.AllowedModels); err != nil {
				return nil, err
			}
			p.SetModels = true
		case "pinned_accounts":
			if pins, err = k.resolvePins(ctx, m.PinnedAccounts); err != nil {
				return nil, err
			}
			p.SetPinned, p.Pinned = true, len(pins) > 0
		case "rate_limit_per_minute":
			if p.RateLimitPerMinute, err = validRateLimit(m.RateLimitPerMinute); err != nil {
				return nil, err
			}
			p.SetRateLimit = true
		case "metered_accounts":
			if p.MeteredAccounts, err = validMetered(m.MeteredAccounts); err != nil {
				return nil, err
			}
			p.SetMetered = true
		default:
			return nil, invalidf("update_mask: unknown field %q (%s)", path, keyRestrictionNames)
		}
	}
	err = k.tx(ctx, func(q *db.Queries) error {
		before := row.RateLimitPerMinute
		if row, err = q.UpdateKeyLimits(ctx, p); err != nil {
			return storeErr(err)
		}
		if p.SetPinned {
			if err := q.ClearKeyAccounts(ctx, row.ID); err != nil {
				return err
			}
			if err := q.AddKeyAccounts(ctx, db.AddKeyAccountsParams{KeyID: row.ID, AccountIds: pins}); err != nil {
				return err
			}
		}
		if p.SetRateLimit && orZero(before) != orZero(row.RateLimitPerMinute) {
			// A new limit starts full: the old one's state means nothing
			// at another rate.
			if err := q.ResetKeyBucket(ctx, row.ID); err != nil {
				return err
			}
		}
		if setTeam {
			if err := q.SetKeyTeam(ctx, db.SetKeyTeamParams{ID: row.ID, TeamID: team}); err != nil {
				return err
			}
			if err := q.RefreshBudgeted(ctx); err != nil {
				return err
			}
		}
		if setBudget {
			if err := setBudgets(ctx, q, uuid.NullUUID{UUID: row.ID, Valid: true}, uuid.NullUUID{}, budgets, k.now()); err != nil {
				return err
			}
		}
		if setTeam || setBudget {
			row, err = q.GetKey(ctx, row.ID)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	k.log.InfoContext(ctx, "client key updated", "key_id", row.ID, "fields", strings.Join(paths, ","))
	k.watch.announce(ctx) // every worker applies it to its next request
	out, err := k.keyProtos(ctx, k.now(), []db.ClientKey{row})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.UpdateKeyResponse{Key: out[0]}), nil
}

func (k keyService) ListKeys(ctx context.Context, req *connect.Request[weirv1.ListKeysRequest]) (*connect.Response[weirv1.ListKeysResponse], error) {
	rows, err := k.q.ListKeys(ctx, req.Msg.IncludeRevoked)
	if err != nil {
		return nil, err
	}
	out, err := k.keyProtos(ctx, k.now(), rows)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.ListKeysResponse{Keys: out}), nil
}

func (k keyService) RevokeKey(ctx context.Context, req *connect.Request[weirv1.RevokeKeyRequest]) (*connect.Response[weirv1.RevokeKeyResponse], error) {
	row, err := k.findKey(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	if row, err = k.q.RevokeKey(ctx, db.RevokeKeyParams{ID: row.ID, Now: k.now()}); err != nil {
		return nil, storeErr(err)
	}
	k.log.InfoContext(ctx, "client key revoked", "key_id", row.ID)
	k.watch.announce(ctx) // no worker serves the key once this returns
	out, err := k.keyProtos(ctx, k.now(), []db.ClientKey{row})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.RevokeKeyResponse{Key: out[0]}), nil
}

// findKey resolves a key id or name.
func (st store) findKey(ctx context.Context, ref string) (db.ClientKey, error) {
	if ref == "" {
		return db.ClientKey{}, invalidf("id: required (a key id or name)")
	}
	if id, err := uuid.Parse(ref); err == nil {
		row, err := st.q.GetKey(ctx, id)
		return row, storeErr(err)
	}
	row, err := st.q.GetKeyByName(ctx, ref)
	return row, storeErr(err)
}

// keyProtos is rows as operators see them, with their pinned accounts
// (one query for all).
func (st store) keyProtos(ctx context.Context, now time.Time, rows []db.ClientKey) ([]*weirv1.Key, error) {
	ids := make([]uuid.UUID, 0, len(rows))
	for _, r := range rows {
		if r.Pinned {
			ids = append(ids, r.ID)
		}
	}
	pins := map[uuid.UUID][]*weirv1.KeyAccount{}
	if len(ids) > 0 {
		accts, err := st.q.KeyAccounts(ctx, ids)
		if err != nil {
			return nil, err
		}
		for _, a := range accts {
			pins[a.KeyID] = append(pins[a.KeyID], &weirv1.KeyAccount{Id: a.AccountID.String(), Label: a.Label})
		}
	}
	budgets, err := st.budgetsByScope(ctx, now)
	if err != nil {
		return nil, err
	}
	teams := map[uuid.UUID]string{}
	if ts, err := st.q.ListTeams(ctx); err == nil {
		for _, t := range ts {
			teams[t.ID] = t.Name
		}
	}
	out := make([]*weirv1.Key, 0, len(rows))
	for _, r := range rows {
		var kb []*weirv1.Budget
		for _, b := range budgets[r.ID] {
			kb = append(kb, budgetProto("key", r.Name, b.Unit, b.Period, b.Amount, b.SpentTokens, b.SpentNanoUsd, b.PeriodStart, b.TimeZone))
		}
		out = append(out, &weirv1.Key{
			Team:               teams[r.TeamID.UUID],
			Budgets:            kb,
			Id:                 r.ID.String(),
			Name:               r.Name,
			Prefix:             r.Prefix,
			CreatedAt:          timestamppb.New(r.CreatedAt),
			RevokedAt:          timestampOrNil(r.RevokedAt),
			LastUsedAt:         timestampOrNil(r.LastUsedAt),
			AllowedModels:      r.AllowedModels,
			Pinned:             r.Pinned,
			PinnedAccounts:     pins[r.ID],
			RateLimitPerMinute: orZero(r.RateLimitPerMinute),
			MeteredAccounts:    enumValue[weirv1.MeteredAccounts](orZero(r.MeteredAccounts)),
		})
	}
	return out, nil
}
