package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
	"github.com/weirhq/weir/controlplane/policy"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/modelpattern"
)

// claimAttempts bounds how often one Acquire retries when a candidate was
// claimed away between the view and the claim; claimRank is how many of
// the eligible accounts one attempt ranks and tries.
const (
	claimAttempts = 4
	claimRank     = 8
)

// leaseService is the workers' API: keys, leases, outcomes, route events,
// settings and the pool's invalidations. It is the request path, so it
// holds only what that path uses.
type leaseService struct {
	weirv1connect.UnimplementedLeaseServiceHandler
	store
	// notifier announces budget thresholds (budgets.go).
	notifier *notify.Notifier
	// prices prices route events (tokens.go).
	prices   *priceCache
	cfg      Config
	settings settingsSource
	seal     *seal.Sealer
	log      *slog.Logger
	now      func() time.Time
	metrics  *metrics
	watch    *poolWatch
	// routes is the routing cache (routecache.go).
	routes *routeCache
	// mergeUsageHeaders folds released answers' usage headers into the
	// usage view (usage.go), which the usage poller writes too.
	mergeUsageHeaders func(ctx context.Context, q *db.Queries, answers []answeredUsage, now time.Time) error
	// markUnreadable marks the credentials this replica cannot open
	// broken (credcheck.go), as its periodic check does.
	markUnreadable func(ctx context.Context, refs []sealedRef) error
}

var errKeyRejected = errors.New("client key is unknown or revoked")

func (l leaseService) VerifyKey(ctx context.Context, req *connect.Request[weirv1.VerifyKeyRequest]) (*connect.Response[weirv1.VerifyKeyResponse], error) {
	row, err := l.q.ActiveKeyByHash(ctx, req.Msg.KeyHash)
	if err != nil {
		if errors.Is(storeErr(err), ErrNotFound) {
			return nil, connect.NewError(connect.CodePermissionDenied, errKeyRejected)
		}
		return nil, err
	}
	resp := &weirv1.VerifyKeyResponse{KeyId: row.ID.String(), KeyName: row.Name,
		AllowedModels: row.AllowedModels, RateLimitPerMinute: orZero(row.RateLimitPerMinute), Budgeted: row.Budgeted}
	if row.TeamID.Valid {
		resp.TeamId = row.TeamID.UUID.String()
	}
	return connect.NewResponse(resp), nil
}

func (l leaseService) Acquire(ctx context.Context, req *connect.Request[weirv1.AcquireRequest]) (*connect.Response[weirv1.AcquireResponse], error) {
	start := time.Now()
	resp, err := l.acquire(ctx, req.Msg)
	if none := resp.GetNoAccount(); err == nil && none.GetQuotaBlock() != nil {
		// The pool is out of quota: the worker answers by the mode in force
		// now, not by its last settings poll.
		st, serr := l.settings.effective(ctx)
		if serr != nil {
			return nil, serr
		}
		none.QuotaResponseMode = st.QuotaResponseMode
	}
	outcome := "lease"
	switch {
	case err != nil:
		outcome = "error"
	case resp.GetNoAccount() != nil:
		outcome = enumName(resp.GetNoAccount().Reason)
	}
	l.metrics.acquireSeconds.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (l leaseService) acquire(ctx context.Context, m *weirv1.AcquireRequest) (resp *weirv1.AcquireResponse, err error) {
	exclude := make(map[uuid.UUID]bool, len(m.ExcludeAccountIds))
	for _, id := range m.ExcludeAccountIds {
		u, err := uuid.Parse(id)
		if err != nil {
			return nil, toConnect(invalidf("exclude_account_ids: %q is not an account id", id))
		}
		exclude[u] = true
	}
	prefer := uuid.Nil
	if m.PreferAccountId != "" {
		if prefer, err = uuid.Parse(m.PreferAccountId); err != nil {
			return nil, toConnect(invalidf("prefer_account_id: %q is not an account id", m.PreferAccountId))
		}
	}
	// One round trip answers the key check, the alias question and what
	// changes per request of the routing view for a concrete model (the
	// rest is the routing cache's); the lease's claim is the second.
	v, err := l.routingView(ctx, m.KeyHash, m.Model, m.SessionKey, policy.ModelFamily(m.Model), waiterOf(m), l.now())
	if err != nil {
		return nil, err
	}
	defer v.done()
	key, aliasTargets, translate := v.key, v.aliasTargets, v.aliasTranslate
	if key.id == uuid.Nil {
		return nil, connect.NewError(connect.CodePermissionDenied, errKeyRejected)
	}
	// The allowlist is checked on the model as asked (the worker checked
	// it too, before asking); an alias then serves only from the targets
	// the list allows as well, so that a key never reaches a model outside
	// its list through an alias.
	if !modelpattern.Match(key.models, m.Model) {
		return nil, modelNotAllowed(m.Model)
	}
	// A budgeted key's request (the worker says so, from VerifyKey) is
	// checked against its budgets, its team's and its session's before
	// anything is leased.
	if m.Unreported != nil {
		block, err := l.checkBudgets(ctx, key.id, m.SessionKey, m.Unreported)
		if err != nil {
			return nil, err
		}
		if block != nil {
			return budgetNoAccount(block), nil
		}
	}
	if m.Model == "" || aliasTargets == nil {
		return l.acquireModel(ctx, key, m, exclude, prefer, &v)
	}
	if len(key.models) > 0 {
		aliasTargets = slices.DeleteFunc(slices.Clone(aliasTargets), func(t string) bool { return !modelpattern.Match(key.models, t) })
		if len(aliasTargets) == 0 {
			return nil, modelNotAllowed(m.Model)
		}
	}
	// A target of another provider's wire is served through translation
	// when the alias allows it (routed as the other wire's surface, for
	// its providers), else never: a Claude model sent to an OpenAI
	// account's /v1/responses would be refused upstream, and counted
	// against the account.
	type routed struct {
		model string
		sf    weirv1.Surface
	}
	var targets []routed
	for _, t := range aliasTargets {
		if sf, ok := policy.TargetSurface(m.Surface, t, translate); ok {
			targets = append(targets, routed{t, sf})
		}
	}
	if len(targets) == 0 {
		return nil, modelNotServed(m.Model, aliasTargets, m.Surface)
	}
	// An alias: the first target with an eligible account serves, and the
	// lease names it for the data plane to send upstream (translated when
	// the lease's provider speaks the other wire).
	var nones []*weirv1.NoAccount
	for _, t := range targets {
		target := t.model
		tm := proto.Clone(m).(*weirv1.AcquireRequest)
		tm.Model, tm.Surface = target, t.sf
		resp, err := l.acquireModel(ctx, key, tm, exclude, prefer, nil)
		if err != nil {
			return nil, err
		}
		if lease := resp.GetLease(); lease != nil {
			lease.Model = target
			return resp, nil
		}
		nones = append(nones, resp.GetNoAccount())
	}
	return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: aliasNoAccount(nones)}}, nil
}

// aliasNoAccount is the answer when no target of an alias has an eligible
// account: the target that recovers soonest on its own, else the first;
// unreachable only when every target's pool is.
func aliasNoAccount(nones []*weirv1.NoAccount) *weirv1.NoAccount {
	best := nones[0]
	unreachable := true
	for i, n := range nones {
		unreachable = unreachable && n.Unreachable != nil
		switch {
		case i == 0, n.Permanent:
		case best.Permanent, best.RetryAt == nil && n.RetryAt != nil:
			best = n
		case n.RetryAt != nil && n.RetryAt.AsTime().Before(best.RetryAt.AsTime()):
			best = n
		}
	}
	if !unreachable {
		best.Unreachable = nil
	}
	return best
}

// acquireModel leases an account for m.Model, a concrete model. first,
// when set, is the routing view already read for it.
func (l leaseService) acquireModel(ctx context.Context, key keyGrant, m *weirv1.AcquireRequest, exclude map[uuid.UUID]bool, prefer uuid.UUID, first *view) (resp *weirv1.AcquireResponse, err error) { //nolint:gocognit // the claim loop over routing rounds; each decision in it is policy's (RouteGatedFirst, GateBreakers, Order.SpillFrom)
	family := policy.ModelFamily(m.Model)
	if first == nil {
		v, err := l.routingView(ctx, "", "", m.SessionKey, family, waiterOf(m), l.now())
		if err != nil {
			return nil, err
		}
		defer v.done()
		first = &v
	}
	// The family's open breakers: a provider's accounts kept out, or this
	// request holding its probe.
	var gate policy.BreakerGate
	// newRound: every account was probed in this round, and this probe
	// begins the next.
	var newRound bool
	if m.Model != "" {
		// On an error, the probes claimed before it go back all the same.
		var gerr error
		gate, gerr = l.breakers(ctx, policy.ProvidersFor(m.Surface), first.breakerOpen, family)
		for p := range gate.Probing {
			provider := enumName(p)
			defer func() {
				if lease := resp.GetLease(); lease != nil && lease.Provider == p {
					// The next probe, which may go before this one
					// answers, goes to another account.
					id, _ := uuid.Parse(lease.AccountId)
					if merr := l.q.MarkProbed(context.WithoutCancel(ctx), db.MarkProbedParams{Provider: provider, Family: family,
						AccountID: id, Restart: newRound, Now: l.now()}); merr != nil {
						l.log.ErrorContext(ctx, "mark probed", "family", family, "err", merr)
					}
					return
				}
				// No account of this provider to probe with: the slot
				// goes back at once.
				if ferr := l.q.FreeProbe(context.WithoutCancel(ctx), db.FreeProbeParams{Provider: provider, Family: family, Now: l.now()}); ferr != nil {
					l.log.ErrorContext(ctx, "free probe slot", "family", family, "err", ferr)
				}
			}()
		}
		if gerr != nil {
			return nil, gerr
		}
		if gate.Closed {
			return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: gate.None}}, nil
		}
	}
	v := first
	// unreadable are the candidates whose credential did not open here.
	unreadable := map[uuid.UUID]bool{}
	var unopened []sealedRef
	// caughtUp: a no-account answer was checked against the changes heard
	// since the view (routeCache.catchUp).
	var caughtUp bool
	for attempt := range claimAttempts {
		now := l.now()
		if attempt > 0 {
			// The last view lost every claim: read it again.
			fresh, err := l.routingView(ctx, "", "", m.SessionKey, family, waiterOf(m), now)
			if err != nil {
				return nil, err
			}
			defer fresh.done()
			v = &fresh
		}
		// A pinned key routes among its pinned accounts only: a session
		// bound to another account is not followed there.
		rr := key.route(policy.RouteRequest{Model: m.Model, Surface: m.Surface, BreakerOpen: gate.Open,
			Exclude: exclude, Unreadable: unreadable, SessionAccount: v.session, PreferAccount: prefer})
		var order policy.Order
		var none *weirv1.NoAccount
		var cands []policy.Candidate
		// Only the best few are ranked: the first is almost always claimed,
		// and a round that loses them all reads the view again. They are
		// found on the routing cache's index, looking at a few accounts
		// rather than the pool; when no account can serve, the whole pool
		// (the key's pins) is ranked, for why.
		routed := false
		if !key.pinned {
			if ix := v.snap.routeIndex(now); ix != nil {
				order, newRound, routed = policy.RouteIndexed(ix, v.fill, rr, gate, now, claimRank)
			}
		}
		if !routed {
			cands = v.pool(key)
			order, none, newRound = policy.RouteGatedFirst(cands, rr, gate, now, claimRank)
		}
		if none != nil && !caughtUp && attempt < claimAttempts-1 {
			// Before saying nothing can serve, hear every change committed
			// so far: route again when one came after the view.
			caughtUp = true
			if l.routes.catchUp(ctx, v.snap) {
				continue
			}
		}
		if none != nil {
			if none.Reason == weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY && m.RequestId != "" && m.WaitingSince != nil {
				// A held request waits for a place, in turn with every
				// worker's requests. (One not held yet may not come back:
				// a client that fails fast, capacity_hold 0. It takes its
				// turn when it does, from its first hold.)
				if err := l.waitFor(ctx, m, policy.WaitingFor(cands, rr, now), now); err != nil {
					return nil, err
				}
			}
			key.pinnedNone(none)
			return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: none}}, nil
		}
		for i, c := range order.First {
			a := v.snap.row(&c)
			// While requests wait for the account's places, its lease is not
			// kept for reuse: a worker would hand it to a later arrival.
			lease, err := l.claim(ctx, a, v.egressDefault, key.id, m, now, reusable(m) && c.Waiting == 0, gate.Probing[c.Account.Provider])
			if errors.Is(err, seal.ErrUnseal) {
				// Unusable until an operator re-enters the credential under
				// this key; the rest of the pool can still serve. When none
				// of it can, the answer is permanent (route).
				unreadable[a.ID] = true
				unopened = append(unopened, sealedRef{id: a.ID, label: a.Label, revision: a.CredentialRevision})
				continue
			}
			if err != nil {
				return nil, err
			}
			if lease == nil {
				// Claimed away, or no longer eligible as the cache has it:
				// the next read has it as it is now.
				l.routes.invalidate(a.ID)
				continue
			}
			v.snap.leased(a.ID, now)
			if m.WaitingSince != nil {
				// It waited its turn: it waits no more.
				if err := l.q.StopWaiting(context.WithoutCancel(ctx), m.RequestId); err != nil {
					l.log.ErrorContext(ctx, "stop waiting", "request_id", m.RequestId, "err", err)
				}
			}
			// Metered, because no subscription could serve: a spill,
			// recorded on the route event and counted by the worker.
			lease.SpilledToMetered = policy.IsMetered(c.Account) && i >= order.SpillFrom
			if len(unopened) > 0 {
				// This replica opened a credential, so its keys are right:
				// those it could not open are marked broken and the next
				// Acquire does not try them (the rule in credcheck.go).
				// Opening none proves nothing: the periodic check decides
				// then.
				if err := l.markUnreadable(ctx, unopened); err != nil {
					l.log.ErrorContext(ctx, "acquire", "err", err)
				}
			}
			return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_Lease{Lease: lease}}, nil
		}
	}
	// Every candidate was claimed away under us, repeatedly: the pool is full.
	return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: &weirv1.NoAccount{
		Reason:  weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY,
		Message: "every eligible account was claimed by concurrent requests",
		RetryAt: timestamppb.New(l.now().Add(time.Second)),
	}}}, nil
}

// waiterTTL is how long a waiter that stopped asking keeps its place in
// the queue: a held request asks again within policy.WaitPoll (its
// worker's parked class within that too, for its longest waiter), so a
// waiter not seen for a few of them has left.
const waiterTTL = 3 * policy.WaitPoll

// waiter is a request as the queue of waiters knows it.
type waiter struct {
	requestID string
	// since is when it began to wait; zero for a request not held yet,
	// which waits behind every waiter.
	since time.Time
}

func waiterOf(m *weirv1.AcquireRequest) waiter {
	w := waiter{requestID: m.RequestId}
	if m.WaitingSince != nil {
		w.since = m.WaitingSince.AsTime()
	}
	return w
}

// waitFor records that m's request, held, waits for a place on accounts: a place
// that frees there goes to the request that waited longest, across
// workers (routing counts the waiters ahead as places promised). A new
// waiter on an account makes workers give its idle leases back.
func (l leaseService) waitFor(ctx context.Context, m *weirv1.AcquireRequest, accounts []uuid.UUID, now time.Time) error {
	if len(accounts) == 0 {
		return nil
	}
	since := now
	if t := m.WaitingSince.AsTime(); t.Before(now) {
		since = t
	}
	return l.q.WaitFor(ctx, db.WaitForParams{AccountIds: accounts, RequestID: m.RequestId, Since: since, Now: now})
}

// reusable says whether a lease for m may be offered for reuse: not for a
// retry (one that excludes or prefers accounts is already off the common
// path, and its next attempt must ask routing again).
func reusable(m *weirv1.AcquireRequest) bool {
	return len(m.ExcludeAccountIds) == 0 && m.PreferAccountId == ""
}

// reuseFor is how long a lease may be reused: between three quarters of
// LeaseReuse and all of it, spread by the lease's (random) id. A worker
// that leased many at once under a burst then replaces them over a
// quarter of the window, not all in the same instant.
func reuseFor(reuse time.Duration, id uuid.UUID) time.Duration {
	return reuse - reuse/4*time.Duration(id[15])/255
}

// claim leases account a, or returns nil when it was claimed away, its
// credential changed, or it stopped being eligible since the view was read.
// reuse offers the lease for reuse (Lease.reuse_until) unless reuse is off
// or the lease is a probe (breakerProbe: this request holds its provider's
// breaker probe; or the account is on its recovery probe): a probe must
// report back before the account takes more. The lease carries the
// account's egress proxy, its own or egressDefault's (sealed), opened
// like the credential: one that does not open fails the claim as an
// unopened credential does.
func (l leaseService) claim(ctx context.Context, a db.Account, egressDefault []byte, keyID uuid.UUID, m *weirv1.AcquireRequest, now time.Time, reuse, breakerProbe bool) (*weirv1.Lease, error) {
	expires := now.Add(l.cfg.LeaseTTL)
	row, err := l.q.ClaimLease(ctx, db.ClaimLeaseParams{
		AccountID:  a.ID,
		Revision:   a.CredentialRevision,
		KeyID:      uuid.NullUUID{UUID: keyID, Valid: true},
		RequestID:  m.RequestId,
		Model:      m.Model,
		SessionKey: m.SessionKey,
		Now:        now,
		ExpiresAt:  expires,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	leaseID := row.LeaseID
	// What the lease carries is the account's row as the claim read it,
	// not the routing cache's.
	a.Label, a.Provider, a.AuthKind, a.BaseUrl = row.Label, row.Provider, row.AuthKind, row.BaseUrl
	a.CredentialSealed, a.UpstreamAccountID, a.RecoveryProbe = row.CredentialSealed, row.UpstreamAccountID, row.RecoveryProbe
	a.EgressProxy, a.EgressProxySealed = row.EgressProxy, row.EgressProxySealed
	credential, err := l.seal.Open(a.ID, a.CredentialRevision, a.CredentialSealed)
	var proxy string
	if err == nil {
		proxy, err = openEgress(l.seal, a, egressDefault)
	}
	if err != nil {
		// Give the lease back at once.
		if _, rerr := l.q.ReleaseLease(ctx, leaseID); rerr != nil {
			l.log.ErrorContext(ctx, "release unusable lease", "lease_id", leaseID, "err", rerr)
		}
		l.log.ErrorContext(ctx, "credential or egress proxy unreadable", "account_id", a.ID, "err", err)
		return nil, err
	}
	base := a.BaseUrl
	if base == "" {
		base = defaultBaseURL(a.Provider)
	}
	lease := &weirv1.Lease{
		Id:           leaseID.String(),
		AccountId:    a.ID.String(),
		AccountLabel: a.Label,
		Provider:     enumValue[weirv1.Provider](a.Provider),
		AuthKind:     enumValue[weirv1.AuthKind](a.AuthKind),
		BaseUrl:      base,
		Credential:   credential,
		ExpiresAt:    timestamppb.New(expires),
		Ttl:          durationpb.New(l.cfg.LeaseTTL),
		// Codex sends the ChatGPT account id with every request.
		UpstreamAccountId: a.UpstreamAccountID,
		EgressProxy:       proxy,
	}
	lease.Probe = breakerProbe || a.RecoveryProbe
	// A budgeted key's requests each ask (checkBudgets): none reuses a lease.
	if reuse && l.cfg.LeaseReuse > 0 && !lease.Probe && m.Unreported == nil {
		lease.ReuseUntil = timestamppb.New(now.Add(reuseFor(l.cfg.LeaseReuse, leaseID)))
	}
	return lease, nil
}

// view is one read of the routing view.
type view struct {
	// snap is the routing cache the candidates are read from: a claim
	// reads the account's row there. facts are what this request adds
	// to it (AcquireFacts), for family at now.
	snap   *routeSnap
	facts  db.AcquireFactsRow
	family string
	now    time.Time
	// cands are every account's candidate once asked for (all); byPos the
	// facts by account position once one account is (fill).
	cands []policy.Candidate
	byPos *requestFacts
	// session is the account the session is bound to; uuid.Nil when none.
	session uuid.UUID
	// key is the client key when it is live (id uuid.Nil: unknown or
	// revoked); aliasTargets the model's targets when it is an alias.
	key          keyGrant
	aliasTargets []string
	// aliasTranslate: the alias's targets of the other wire may be served
	// through translation.
	aliasTranslate bool
	// breakerOpen names the providers whose breaker for the family is open
	// or probing: Acquire asks only those.
	breakerOpen map[weirv1.Provider]bool
	// egressDefault is the default egress proxy, sealed; nil when none.
	egressDefault []byte
}

// done gives the view's candidates back for another read's: nothing may
// read them after.
func (v *view) done() {
	recycleCandidates(v.cands)
	v.cands = nil
}

// all is every account's candidate (routeSnap.candidates), read once.
func (v *view) all() []policy.Candidate {
	if v.cands == nil {
		v.cands = v.snap.candidates(v.family, v.now, &v.facts)
	}
	return v.cands
}

// fill writes the account at position i as all has it, alone
// (policy.Fill).
func (v *view) fill(i int, c *policy.Candidate) {
	if v.byPos == nil {
		rf := v.snap.factsOf(&v.facts)
		v.byPos = &rf
	}
	v.snap.fill(i, c, v.family, v.now, v.byPos)
}

// pool is the candidates of the accounts key may route to: every one, or
// a pinned key's pins alone (keyGrant.pinnedAt), without reading the rest.
func (v *view) pool(key keyGrant) []policy.Candidate {
	if !key.pinned {
		return v.all()
	}
	at := key.pinnedAt(v.snap.index)
	out := make([]policy.Candidate, len(at))
	for j, i := range at {
		v.fill(i, &out[j])
	}
	return out
}

// routingView reads every account with its live leases, cooldown and gate
// for the model family (the routing cache, with what changes per request
// read now), the account the session is bound to, if it is still bound,
// the family's breakers, and the key and alias answers.
func (l leaseService) routingView(ctx context.Context, keyHash, model, sessionKey, family string, w waiter, now time.Time) (view, error) {
	snap, err := l.routes.read(ctx)
	if err != nil {
		return view{}, err
	}
	since := w.since
	if since.IsZero() {
		since = now // a request not held yet waits behind every waiter
	}
	f, err := l.q.AcquireFacts(ctx, db.AcquireFactsParams{KeyHash: keyHash, Model: model, Now: now, SessionKey: sessionKey,
		BoundSince: now.Add(-l.cfg.SessionTTL), Family: family, RequestID: w.requestID, WaitingSince: since,
		WaitersSeenSince: now.Add(-waiterTTL)})
	if err != nil {
		return view{}, err
	}
	v := view{snap: snap, facts: f, family: family, now: now}
	v.key = keyGrant{id: f.KeyID, models: f.KeyAllowedModels, pinned: f.KeyPinned, pins: f.KeyPins}.
		withMetered(f.KeyMeteredAccounts, f.MeteredSetting).withOwned(f.KeyTeamID, f.OwnedSetting)
	v.aliasTargets, v.aliasTranslate = f.AliasTargets, f.AliasTranslate
	v.egressDefault = f.EgressDefaultSealed
	for _, p := range f.BreakerOpen {
		if v.breakerOpen == nil {
			v.breakerOpen = map[weirv1.Provider]bool{}
		}
		v.breakerOpen[enumValue[weirv1.Provider](p)] = true
	}
	if _, ok := snap.index[f.SessionAccount]; ok && sessionKey != "" {
		v.session = f.SessionAccount
	}
	return v, nil
}

// maxRenewBatch bounds one RenewBatch call.
const maxRenewBatch = 10000

func (l leaseService) RenewBatch(ctx context.Context, req *connect.Request[weirv1.RenewBatchRequest]) (*connect.Response[weirv1.RenewBatchResponse], error) {
	if n := len(req.Msg.LeaseIds); n > maxRenewBatch {
		return nil, toConnect(invalidf("lease_ids: at most %d per call, got %d", maxRenewBatch, n))
	}
	if n := len(req.Msg.RequestIds); n > maxRenewBatch {
		return nil, toConnect(invalidf("request_ids: at most %d per call, got %d", maxRenewBatch, n))
	}
	ids := make([]uuid.UUID, 0, len(req.Msg.LeaseIds))
	for i, raw := range req.Msg.LeaseIds {
		id, err := uuid.Parse(raw)
		if err != nil {
			return nil, toConnect(invalidf("lease_ids[%d]: not a lease id", i))
		}
		ids = append(ids, id)
	}
	now := l.now()
	exp := now.Add(l.cfg.LeaseTTL)
	var renewed []uuid.UUID
	if len(ids) > 0 {
		var err error
		if renewed, err = l.q.RenewLeases(ctx, db.RenewLeasesParams{Ids: ids, Now: now, ExpiresAt: exp}); err != nil {
			return nil, err
		}
	}
	if len(req.Msg.RequestIds) > 0 {
		if err := l.q.RenewPendingRoutes(ctx, db.RenewPendingRoutesParams{RequestIds: req.Msg.RequestIds, Until: exp}); err != nil {
			return nil, err
		}
	}
	out := &weirv1.RenewBatchResponse{RenewedLeaseIds: make([]string, 0, len(renewed)), ExpiresAt: timestamppb.New(exp)}
	for _, id := range renewed {
		out.RenewedLeaseIds = append(out.RenewedLeaseIds, id.String())
	}
	return connect.NewResponse(out), nil
}

func (l leaseService) Release(ctx context.Context, req *connect.Request[weirv1.ReleaseRequest]) (*connect.Response[weirv1.ReleaseResponse], error) {
	id, err := uuid.Parse(req.Msg.LeaseId)
	if err != nil {
		return nil, toConnect(invalidf("lease_id: not a lease id"))
	}
	o := req.Msg.Outcome
	if o == nil {
		return nil, toConnect(invalidf("outcome: required"))
	}
	if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS {
		return l.releaseSuccess(ctx, id, o)
	}
	var out *weirv1.Decision
	var account uuid.UUID
	err = l.tx(ctx, func(q *db.Queries) error {
		row, err := q.ReleaseLease(ctx, id)
		if err != nil {
			return storeErr(err)
		}
		account = row.AccountID
		now := l.now()
		facts, err := l.releaseFacts(ctx, q, row, o, now)
		if err != nil {
			return err
		}
		answers, err := l.applyEffects(ctx, q, []released{{row: row, outcome: o, effects: policy.Decide(o, facts, now)}}, now)
		if err != nil {
			return err
		}
		out = answers[0]
		return nil
	})
	if account != uuid.Nil {
		// Committed or not, this replica's next route reads the account
		// as it is now (its cooldown, gate or overload mark).
		l.routes.invalidate(account)
	}
	if err != nil {
		return nil, err
	}
	l.metrics.releases.WithLabelValues(enumName(o.Class)).Inc()
	return connect.NewResponse(&weirv1.ReleaseResponse{Decision: out}), nil
}

// releaseFacts reads what policy.Decide needs of a failure beyond its
// outcome, in Release's transaction: the account's state from the lease's
// row, the spent windows of the usage view for a rate limit, and for a
// credential rejection the count of them, which it records (the account
// breaks at the threshold) unless the credential was replaced meanwhile.
func (l leaseService) releaseFacts(ctx context.Context, q *db.Queries, row db.ReleaseLeaseRow, o *weirv1.Outcome, now time.Time) (policy.Facts, error) {
	f := policy.Facts{OAuth: row.AuthKind == enumName(weirv1.AuthKind_AUTH_KIND_OAUTH), Family: policy.ModelFamily(row.Model),
		QuotaBackoffs: row.QuotaBackoffs, RecoveryProbe: row.RecoveryProbe}
	switch o.Class {
	case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:
		r, err := q.RecordAuthFailure(ctx, db.RecordAuthFailureParams{
			ID:                 row.AccountID,
			CredentialRevision: row.CredentialRevision,
			Threshold:          int32(l.cfg.AuthFailureThreshold),
			Reason:             "credential rejected by the upstream (" + policy.EvidenceSummary(policy.EvidenceOf(o)) + ")",
			Now:                now,
		})
		switch {
		case errors.Is(storeErr(err), ErrNotFound):
			// The credential was replaced while this attempt ran: the
			// rejection was of the old one and says nothing of the new.
			f.Stale = true
		case err != nil:
			return f, err
		default:
			f.AuthFailures = r.AuthFailures
			if r.Broken {
				l.log.WarnContext(ctx, "account broken", "account_id", row.AccountID, "auth_failures", f.AuthFailures)
			}
		}
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		spent, err := spentWindows(ctx, q, row.AccountID, now)
		if err != nil {
			return f, err
		}
		f.Spent = spent
	case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
		// Routing tries the accounts that answer first. Written here, before
		// the breaker's row is locked: the account's row comes first, as in
		// a success's record.
		if err := q.MarkOverloaded(ctx, db.MarkOverloadedParams{ID: row.AccountID, Now: now, RewriteBefore: now.Add(-time.Second)}); err != nil {
			return f, err
		}
		answering, err := q.OthersAnswering(ctx, db.OthersAnsweringParams{Provider: row.Provider, AccountID: row.AccountID,
			Since: now.Add(-policy.AnsweringWindow)})
		if err != nil {
			return f, err
		}
		f.OthersAnswering = answering
	}
	return f, nil
}

// releaseSuccess is Release for a success, in two statements (and the
// usage headers' upserts when they carry a reading) instead of a
// transaction: nothing needs them atomic, a lease gone without its
// success record (a crash between the two) only misses a last-success
// time. It applies the success exactly as ReleaseBatch does.
func (l leaseService) releaseSuccess(ctx context.Context, id uuid.UUID, o *weirv1.Outcome) (*connect.Response[weirv1.ReleaseResponse], error) {
	row, err := l.q.ReleaseLease(ctx, id)
	if err != nil {
		return nil, storeErr(err)
	}
	now := l.now()
	answers, err := l.applyEffects(ctx, l.q, []released{releasedSuccess(row, o, row.AcquiredAt, now)}, now)
	if err != nil {
		return nil, err
	}
	l.routes.afterSuccess(row.AccountID, o.GetHeaders(), now)
	l.metrics.releases.WithLabelValues(enumName(weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS)).Inc()
	return connect.NewResponse(&weirv1.ReleaseResponse{Decision: answers[0]}), nil
}

func durationMillis(d *durationpb.Duration) float64 {
	return float64(d.AsDuration()) / float64(time.Millisecond)
}

// PoolQuota answers whether every eligible account for a request is
// blocked by quota evidence, leasing nothing. For an alias, every target
// must be blocked; the block that reopens first is named.
func (l leaseService) PoolQuota(ctx context.Context, req *connect.Request[weirv1.PoolQuotaRequest]) (*connect.Response[weirv1.PoolQuotaResponse], error) {
	m := req.Msg
	key, err := l.q.ActiveKeyAndAlias(ctx, db.ActiveKeyAndAliasParams{KeyHash: m.KeyHash, Model: m.Model})
	if err != nil {
		if errors.Is(storeErr(err), ErrNotFound) {
			return nil, connect.NewError(connect.CodePermissionDenied, errKeyRejected)
		}
		return nil, err
	}
	models := key.AliasTargets
	if m.Model == "" || models == nil {
		models = []string{m.Model}
	} else if len(key.AllowedModels) > 0 {
		// As Acquire routes it: only the targets the key may use.
		models = slices.DeleteFunc(slices.Clone(models), func(t string) bool { return !modelpattern.Match(key.AllowedModels, t) })
	}
	st, err := l.settings.effective(ctx)
	if err != nil {
		return nil, err
	}
	// As Acquire sees the pool for this key: its pins, and under
	// owners_only the seats it owns and none of another owner's.
	kg := keyGrant{id: key.KeyID, pinned: key.Pinned, pins: key.Pins}.withMetered(orZero(key.MeteredAccounts), enumName(st.MeteredAccounts)).
		withOwned(key.TeamID.UUID, enumName(st.OwnedAccounts))
	now := l.now()
	first, snap, err := l.quotaBlock(ctx, m.Surface, models, key.AliasTranslate && key.AliasTargets != nil, kg, now)
	if err == nil && first != nil && snap != nil && l.routes.catchUp(ctx, snap) {
		// A final usage limit is not said on a stale cache: judged again
		// over the changes heard since.
		first, _, err = l.quotaBlock(ctx, m.Surface, models, key.AliasTranslate && key.AliasTargets != nil, kg, now)
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.PoolQuotaResponse{QuotaBlock: first, QuotaResponseMode: st.QuotaResponseMode}), nil
}

// quotaBlock is PoolQuota's verdict over models for a key (kg): the
// block that reopens first when every model's pool is blocked by quota,
// else nil; snap is the routing cache the first view was read from.
func (l leaseService) quotaBlock(ctx context.Context, sf weirv1.Surface, models []string, translate bool, kg keyGrant, now time.Time) (first *weirv1.QuotaBlock, snap *routeSnap, err error) {
	for _, model := range models {
		// A target is judged on the surface it is routed as (the other
		// wire's, translated), and one it cannot be routed as not at all.
		tsf, ok := policy.TargetSurface(sf, model, translate)
		if !ok {
			continue
		}
		v, err := l.routingView(ctx, "", "", "", policy.ModelFamily(model), waiter{}, now)
		if err != nil {
			return nil, nil, err
		}
		if snap == nil {
			snap = v.snap
		}
		qb := policy.QuotaBlock(v.pool(kg), kg.route(policy.RouteRequest{Model: model, Surface: tsf}), now)
		v.done()
		if qb == nil {
			return nil, snap, nil
		}
		if first == nil || policy.ReopensFirst(qb, first) {
			first = qb
		}
	}
	return first, snap, nil
}
