package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/modelpattern"
)

// Bounds of a key's restrictions.
const (
	maxKeyModels   = 64
	maxKeyPins     = 100
	maxRatePerMin  = 100000
	rateLimitFrame = time.Minute
)

// validModels checks an allowlist; an empty one is stored as NULL (any
// model).
func validModels(patterns []string) ([]string, error) {
	if len(patterns) == 0 {
		return nil, nil
	}
	if len(patterns) > maxKeyModels {
		return nil, invalidf("allowed_models: at most %d patterns, got %d", maxKeyModels, len(patterns))
	}
	out := make([]string, 0, len(patterns))
	for i, p := range patterns {
		if err := modelpattern.Valid(p); err != nil {
			return nil, invalidf("allowed_models[%d] %q: %v", i, p, err)
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// validRateLimit checks a requests-per-minute limit; 0 is none (NULL).
func validRateLimit(n int32) (*int32, error) {
	switch {
	case n == 0:
		return nil, nil
	case n < 0 || n > maxRatePerMin:
		return nil, invalidf("rate_limit_per_minute: must be between 1 and %d, or 0 for no limit; got %d", maxRatePerMin, n)
	}
	return &n, nil
}

// validMetered checks a key's metered_accounts; UNSPECIFIED is stored as
// NULL (the key follows the global setting).
func validMetered(m weirv1.MeteredAccounts) (*string, error) {
	if m == weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED {
		return nil, nil
	}
	if !slices.Contains(meteredModes, m) {
		return nil, invalidf("metered_accounts: unknown value %d; want normal, last_resort or never, or unspecified to follow the global setting", int32(m))
	}
	name := enumName(m)
	return &name, nil
}

// resolvePins turns account ids or labels into ids, refusing any that does
// not name an account.
func (st store) resolvePins(ctx context.Context, refs []string) ([]uuid.UUID, error) {
	if len(refs) > maxKeyPins {
		return nil, invalidf("pinned_accounts: at most %d accounts, got %d", maxKeyPins, len(refs))
	}
	out := make([]uuid.UUID, 0, len(refs))
	for i, ref := range refs {
		if ref == "" {
			return nil, invalidf("pinned_accounts[%d]: empty (an account id or label)", i)
		}
		a, err := st.findAccount(ctx, ref)
		if errors.Is(err, ErrNotFound) {
			return nil, invalidf("pinned_accounts[%d]: no account %q", i, ref)
		}
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, a.ID) {
			out = append(out, a.ID)
		}
	}
	return out, nil
}

// keyGrant is what Acquire learned of a live key: its id and what
// restricts it.
type keyGrant struct {
	id     uuid.UUID
	models []string // nil: any model
	// pinned restricts the key to pins, which may be empty (every pinned
	// account was deleted): then no account serves it.
	pinned bool
	pins   []uuid.UUID
	// metered is the metered_accounts setting in force for the key: its
	// own (byKey), else the global one.
	metered weirv1.MeteredAccounts
	byKey   bool
	// team is the key's team (uuid.Nil: none): the key owns the seats
	// owned by it or by its team. owned is the owned_accounts setting.
	team  uuid.UUID
	owned weirv1.OwnedAccounts
}

// withOwned is k with its team and the owned_accounts setting (its
// stored name; "" is the default, shared).
func (k keyGrant) withOwned(team uuid.UUID, setting string) keyGrant {
	k.team, k.owned = team, enumValue[weirv1.OwnedAccounts](setting)
	return k
}

// withMetered is k with the metered_accounts setting in force: the key's
// own (stored name, "" when it follows the global one), else global's.
func (k keyGrant) withMetered(own, global string) keyGrant {
	if m := enumValue[weirv1.MeteredAccounts](own); m != weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED {
		k.metered, k.byKey = m, true
		return k
	}
	k.metered, k.byKey = enumValue[weirv1.MeteredAccounts](global), false
	return k
}

// route is rr under the key's metered_accounts setting, as the key (and
// its team) under owned_accounts: policy.Route keeps other owners' seats
// out under owners_only, and ranks the key's own seats first. Pinning
// (pinnedAt) narrows the candidates before that, so the two compose: a
// pinned key routes among the accounts it is pinned to that are not
// another owner's seat under owners_only. A pin never grants a seat.
func (k keyGrant) route(rr policy.RouteRequest) policy.RouteRequest {
	rr.Metered, rr.MeteredByKey = k.metered, k.byKey
	rr.Key, rr.Team, rr.Owned = k.id, k.team, k.owned
	return rr
}

// allows says whether the key may route to account id.
func (k keyGrant) allows(id uuid.UUID) bool { return !k.pinned || slices.Contains(k.pins, id) }

// pinnedAt are the positions, in a pool whose accounts' positions are
// index, of the accounts a pinned key may use (allows), in the pool's
// order: its pins that are in the pool, once each.
func (k keyGrant) pinnedAt(index map[uuid.UUID]int) []int {
	at := make([]int, 0, len(k.pins))
	for _, id := range k.pins {
		if i, ok := index[id]; ok {
			at = append(at, i)
		}
	}
	slices.Sort(at)
	return slices.Compact(at)
}

// pinnedNone rewords a "none configured" answer for a pinned key: the
// pin, not the pool, is why, and only an operator can change it. An
// answer that names a setting (metered_accounts=never,
// owned_accounts=owners_only) already says why.
func (k keyGrant) pinnedNone(none *weirv1.NoAccount) {
	if !k.pinned || none == nil || none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED ||
		strings.Contains(none.Message, policy.MeteredNever) || strings.Contains(none.Message, policy.OwnersOnly) {
		return
	}
	if len(k.pins) == 0 {
		none.Message = "this key is pinned to accounts that no longer exist; an operator must pin it to another account"
	} else {
		none.Message = fmt.Sprintf("none of the %d accounts this key is pinned to serves this model", len(k.pins))
	}
}

// modelNotAllowed is Acquire's refusal of a model outside the key's
// allowlist: PERMISSION_DENIED with a ModelNotAllowed detail, which the
// worker answers as a 403 in the client's format. It names the model,
// never the key.
func modelNotAllowed(model string) error {
	err := connect.NewError(connect.CodePermissionDenied, fmt.Errorf("model %q is not allowed for this key", model))
	if d, derr := connect.NewErrorDetail(&weirv1.ModelNotAllowed{Model: model}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// TakeRequestToken takes one request from the key's rate limit: one
// statement against the key's bucket row, so that the limit is the key's
// total across every worker and control-plane replica.
func (l leaseService) TakeRequestToken(ctx context.Context, req *connect.Request[weirv1.TakeRequestTokenRequest]) (*connect.Response[weirv1.TakeRequestTokenResponse], error) {
	now := l.now()
	row, err := l.q.TakeKeyToken(ctx, db.TakeKeyTokenParams{KeyHash: req.Msg.KeyHash, Now: now})
	if err != nil {
		if errors.Is(storeErr(err), ErrNotFound) {
			return nil, connect.NewError(connect.CodePermissionDenied, errKeyRejected)
		}
		return nil, err
	}
	limit := orZero(row.RateLimitPerMinute)
	out := &weirv1.TakeRequestTokenResponse{Admitted: limit == 0 || row.Admitted, RateLimitPerMinute: limit}
	if !out.Admitted {
		out.RetryAfter = durationpb.New(tokenWait(row.Tat, limit, now))
		l.metrics.keyRateLimited.Inc()
	}
	return connect.NewResponse(out), nil
}

// tokenWait is how long until a bucket at tat admits a request at limit
// per minute: until max(tat, now) + interval fits within a minute of now.
func tokenWait(tat time.Time, limit int32, now time.Time) time.Duration {
	interval := (rateLimitFrame / time.Duration(limit)).Truncate(time.Microsecond)
	return max(tat.Add(interval).Sub(now.Add(rateLimitFrame)), 0)
}
