package controlplane

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

const defaultMaxConcurrency = 4

type accountService struct {
	weirv1connect.UnimplementedAccountServiceHandler
	store
	now        func() time.Time
	log        *slog.Logger
	seal       *seal.Sealer
	watch      *poolWatch
	views      accountViews
	identities identities
	// readUsage and bankedReset are the replica's, shared with its jobs:
	// the budgeted usage read (usage.go) and a banked-reset claim
	// (banked.go).
	readUsage   func(context.Context, uuid.UUID) (usageResult, error)
	bankedReset func(ctx context.Context, id uuid.UUID, grant string) (bankedOutcome, error)
	// enqueueCheck enqueues a credential's check in the transaction that
	// stores it (accountcheck.go).
	enqueueCheck func(ctx context.Context, tx pgx.Tx, id uuid.UUID, revision int64) error
}

// accountViews builds accounts as operators see them: the row with its
// live leases, cooldowns, family gates, transport runs, usage and
// forecasts.
type accountViews struct {
	store
	now func() time.Time
	// opens says whether this replica's keys open an account's credential.
	opens     func(db.Account) bool
	forecasts func(context.Context, time.Time) (map[uuid.UUID][]*weirv1.Forecast, error)
}

func (a accountService) CreateAccount(ctx context.Context, req *connect.Request[weirv1.CreateAccountRequest]) (*connect.Response[weirv1.CreateAccountResponse], error) {
	m := req.Msg
	if err := validProviderAuth(m.Provider, m.AuthKind); err != nil {
		return nil, err
	}
	if err := validLabel(m.Label); err != nil {
		return nil, err
	}
	cred, err := parseCredential(m.Provider, m.AuthKind, m.Credential)
	if err != nil {
		return nil, err
	}
	upstreamID, err := upstreamAccountID(m.Provider, m.UpstreamAccountId, cred.accountID)
	if err != nil {
		return nil, err
	}
	if err := validBaseURL(m.BaseUrl); err != nil {
		return nil, err
	}
	proxy, err := parseEgress("egress_proxy", m.EgressProxy, true)
	if err != nil {
		return nil, err
	}
	maxConc := m.MaxConcurrency
	if maxConc == 0 {
		maxConc = defaultMaxConcurrency
	}
	if maxConc < 0 || maxConc > 10000 {
		return nil, invalidf("max_concurrency: must be between 1 and 10000")
	}
	provider := enumName(m.Provider)
	// The profile read is the account's first call: through its proxy.
	via := func() (string, error) { return a.egressURL(ctx, proxy) }
	identity := a.identities.identityFor(ctx, m.Provider, m.AuthKind, m.BaseUrl, upstreamID, cred, via)
	// A Claude login first added while its profile did not answer is named
	// by its token's hash.
	names := []string{identity}
	if m.Provider == weirv1.Provider_PROVIDER_ANTHROPIC && m.AuthKind == weirv1.AuthKind_AUTH_KIND_OAUTH {
		names = append(names, tokenIdentity(cred))
	}
	if err := a.identities.nameUnnamed(ctx, provider); err != nil {
		return nil, err
	}
	id := uuid.New()
	var row db.Account
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := a.q.WithTx(tx)
		if err := findDuplicate(ctx, q, provider, db.Account{}, names...); err != nil {
			return err
		}
		var err error
		row, err = q.CreateAccount(ctx, db.CreateAccountParams{
			ID:                id,
			Provider:          enumName(m.Provider),
			AuthKind:          enumName(m.AuthKind),
			Label:             m.Label,
			BaseUrl:           strings.TrimRight(m.BaseUrl, "/"),
			MaxConcurrency:    maxConc,
			Priority:          m.Priority,
			CredentialSealed:  a.seal.Seal(id, 1, cred.access),
			CredentialHint:    seal.Hint(cred.access),
			UpstreamAccountID: upstreamID,
			EgressProxy:       proxy.shown,
			EgressProxySealed: proxy.sealed(a.seal, id),
			Now:               a.now(),
		})
		if err != nil {
			return err
		}
		if identity != "" {
			if row, err = q.SetAccountIdentity(ctx, db.SetAccountIdentityParams{ID: id, Identity: identity}); err != nil {
				return err
			}
		}
		if cred.refresh != "" || cred.expiresAt != nil {
			if row, err = setOAuthTokens(ctx, q, a.seal, id, row.CredentialRevision, cred); err != nil {
				return err
			}
		}
		return a.enqueueCheck(ctx, tx, id, row.CredentialRevision)
	})
	if isIdentityConflict(err) {
		// A concurrent create of the same upstream account won.
		if dup := findDuplicate(ctx, a.q, provider, db.Account{}, identity); dup != nil {
			err = dup
		}
	}
	var dup errDuplicate
	if errors.As(err, &dup) {
		return nil, dup.connectErr()
	}
	if err != nil {
		return nil, storeErr(err)
	}
	a.log.InfoContext(ctx, "account created", "account_id", id, "label", row.Label, "provider", row.Provider, "auth_kind", row.AuthKind,
		"egress_proxy", row.EgressProxy)
	acct, err := a.views.accountView(ctx, row)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.CreateAccountResponse{Account: acct}), nil
}

func (a accountService) ListAccounts(ctx context.Context, _ *connect.Request[weirv1.ListAccountsRequest]) (*connect.Response[weirv1.ListAccountsResponse], error) {
	now := a.now()
	rows, err := a.q.ListAccounts(ctx)
	if err != nil {
		return nil, err
	}
	st, err := a.views.liveState(ctx, now)
	if err != nil {
		return nil, err
	}
	out := make([]*weirv1.Account, 0, len(rows))
	for _, r := range rows {
		out = append(out, st.account(r))
	}
	return connect.NewResponse(&weirv1.ListAccountsResponse{Accounts: out}), nil
}

func (a accountService) GetAccount(ctx context.Context, req *connect.Request[weirv1.GetAccountRequest]) (*connect.Response[weirv1.GetAccountResponse], error) {
	row, err := a.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	acct, err := a.views.accountView(ctx, row)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.GetAccountResponse{Account: acct}), nil
}

func (a accountService) UpdateAccount(ctx context.Context, req *connect.Request[weirv1.UpdateAccountRequest]) (*connect.Response[weirv1.UpdateAccountResponse], error) { //nolint:gocognit // the update mask applied field by field, each field a small case of its own
	m := req.Msg
	row, err := a.findAccount(ctx, m.Id)
	if err != nil {
		return nil, err
	}
	paths := m.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidf("update_mask: name at least one field")
	}
	p := db.UpdateAccountParams{ID: row.ID, Now: a.now()}
	provider := enumValue[weirv1.Provider](row.Provider)
	var newCredential *credentialInput
	var newProxy *egressInput
	var newOwner *db.SetAccountOwnerParams
	banked := db.SetBankedResetsParams{ID: row.ID}
	for _, path := range paths {
		switch path {
		case "banked_resets_enabled", "org_id":
			if err := bankedUpdate(&banked, path, m); err != nil {
				return nil, err
			}
		case "label":
			if err := validLabel(m.Label); err != nil {
				return nil, err
			}
			p.Label = &m.Label
		case "base_url":
			if err := validBaseURL(m.BaseUrl); err != nil {
				return nil, err
			}
			u := strings.TrimRight(m.BaseUrl, "/")
			p.BaseUrl = &u
		case "max_concurrency":
			if m.MaxConcurrency < 1 || m.MaxConcurrency > 10000 {
				return nil, invalidf("max_concurrency: must be between 1 and 10000")
			}
			p.MaxConcurrency = &m.MaxConcurrency
		case "priority":
			p.Priority = &m.Priority
		case "upstream_account_id":
			if m.UpstreamAccountId != "" || provider == weirv1.Provider_PROVIDER_CODEX {
				if _, err := upstreamAccountID(provider, m.UpstreamAccountId, ""); err != nil {
					return nil, err
				}
			}
			p.UpstreamAccountID = &m.UpstreamAccountId
		case "credential":
			cred, err := parseCredential(provider, enumValue[weirv1.AuthKind](row.AuthKind), m.Credential)
			if err != nil {
				return nil, err
			}
			newCredential = &cred
		case "egress_proxy":
			in, err := parseEgress("egress_proxy", m.EgressProxy, true)
			if err != nil {
				return nil, err
			}
			newProxy = &in
		case "owner":
			o, err := a.resolveOwner(ctx, row, m.GetOwner())
			if err != nil {
				return nil, err
			}
			o.ID, o.Now = row.ID, p.Now
			newOwner = &o
		default:
			return nil, invalidf("update_mask: unknown field %q", path)
		}
	}
	// A new Codex credential names its ChatGPT account, unless the request
	// names one itself.
	if newCredential != nil && newCredential.accountID != "" && p.UpstreamAccountID == nil {
		p.UpstreamAccountID = &newCredential.accountID
	}
	// A new API key, or another ChatGPT account id, names another upstream
	// account. A Claude login keeps its identity: its new tokens are
	// usually the same login's.
	var newIdentity *string
	switch {
	case provider == weirv1.Provider_PROVIDER_CODEX && p.UpstreamAccountID != nil:
		newIdentity = p.UpstreamAccountID
	case newCredential != nil && row.AuthKind == enumName(weirv1.AuthKind_AUTH_KIND_API_KEY):
		h := hashIdentity(newCredential.access)
		newIdentity = &h
	}
	oldBase := row.BaseUrl
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := a.q.WithTx(tx)
		var err error
		if newIdentity != nil && *newIdentity != row.Identity {
			if err := findDuplicate(ctx, q, row.Provider, row, *newIdentity); err != nil {
				return err
			}
			if _, err := q.SetAccountIdentity(ctx, db.SetAccountIdentityParams{ID: row.ID, Identity: *newIdentity}); err != nil {
				return storeErr(err)
			}
		}
		if row, err = q.UpdateAccount(ctx, p); err != nil {
			return storeErr(err)
		}
		if p.BaseUrl != nil && *p.BaseUrl != oldBase {
			// The old address's failures say nothing of the new one.
			if _, err := q.ClearTransportCooldown(ctx, row.ID); err != nil {
				return err
			}
		}
		if banked.Enabled.Valid || banked.OrgID != nil {
			if row, err = q.SetBankedResets(ctx, banked); err != nil {
				return storeErr(err)
			}
		}
		if newProxy != nil {
			oldProxy := row.EgressProxy
			if row, err = q.SetEgressProxy(ctx, db.SetEgressProxyParams{ID: row.ID, EgressProxy: newProxy.shown,
				EgressProxySealed: newProxy.sealed(a.seal, row.ID), Now: p.Now}); err != nil {
				return storeErr(err)
			}
			if newProxy.shown != oldProxy {
				// The old route's failures say nothing of the new one.
				if _, err := q.ClearTransportCooldown(ctx, row.ID); err != nil {
					return err
				}
			}
		}
		if newOwner != nil {
			if row, err = q.SetAccountOwner(ctx, *newOwner); err != nil {
				return storeErr(err)
			}
		}
		if newCredential == nil {
			return nil
		}
		rev := row.CredentialRevision + 1
		row, err = q.ReplaceCredential(ctx, db.ReplaceCredentialParams{
			ID:                 row.ID,
			CredentialSealed:   a.seal.Seal(row.ID, rev, newCredential.access),
			CredentialRevision: rev,
			CredentialHint:     seal.Hint(newCredential.access),
			Now:                p.Now,
		})
		if err != nil {
			return err
		}
		// Always: the old credential's refresh token and state go with it.
		if row, err = setOAuthTokens(ctx, q, a.seal, row.ID, rev, *newCredential); err != nil {
			return err
		}
		// The old credential's verdict does not bind the new one.
		if _, err = q.ClearCredentialCooldown(ctx, row.ID); err != nil {
			return err
		}
		return a.enqueueCheck(ctx, tx, row.ID, row.CredentialRevision)
	})
	if dup := (errDuplicate{}); errors.As(err, &dup) {
		return nil, dup.connectErr()
	}
	if err != nil {
		return nil, err
	}
	if newProxy != nil {
		a.log.InfoContext(ctx, "account egress proxy set", "account_id", row.ID, "egress_proxy", row.EgressProxy)
	}
	if newOwner != nil {
		a.log.InfoContext(ctx, "account owner set", "account_id", row.ID,
			"owner_key_id", row.OwnerKeyID.UUID, "owner_team_id", row.OwnerTeamID.UUID)
		// Workers drop the account's reused leases before this returns (a
		// key that may no longer use it must not keep reusing it).
		a.watch.announce(ctx)
	}
	acct, err := a.views.accountView(ctx, row)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.UpdateAccountResponse{Account: acct}), nil
}

func (a accountService) PauseAccount(ctx context.Context, req *connect.Request[weirv1.PauseAccountRequest]) (*connect.Response[weirv1.PauseAccountResponse], error) {
	row, err := a.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	if row, err = a.q.SetPaused(ctx, db.SetPausedParams{ID: row.ID, Paused: true, Now: a.now()}); err != nil {
		return nil, storeErr(err)
	}
	a.log.InfoContext(ctx, "account paused", "account_id", row.ID)
	acct, err := a.views.accountView(ctx, row)
	if err != nil {
		return nil, err
	}
	a.watch.announce(ctx) // workers stop reusing it before this returns
	return connect.NewResponse(&weirv1.PauseAccountResponse{Account: acct}), nil
}

func (a accountService) ResumeAccount(ctx context.Context, req *connect.Request[weirv1.ResumeAccountRequest]) (*connect.Response[weirv1.ResumeAccountResponse], error) {
	row, err := a.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	err = a.tx(ctx, func(q *db.Queries) error {
		var err error
		if row, err = q.ResumeAccount(ctx, db.ResumeAccountParams{ID: row.ID, Now: a.now()}); err != nil {
			return storeErr(err)
		}
		if _, err = q.ClearCooldown(ctx, row.ID); err != nil {
			return err
		}
		_, err = q.ClearFamilyGates(ctx, row.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	a.log.InfoContext(ctx, "account resumed", "account_id", row.ID)
	acct, err := a.views.accountView(ctx, row)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.ResumeAccountResponse{Account: acct}), nil
}

func (a accountService) DeleteAccount(ctx context.Context, req *connect.Request[weirv1.DeleteAccountRequest]) (*connect.Response[weirv1.DeleteAccountResponse], error) {
	row, err := a.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	if _, err := a.q.DeleteAccount(ctx, row.ID); err != nil {
		return nil, err
	}
	a.log.InfoContext(ctx, "account deleted", "account_id", row.ID)
	a.watch.announce(ctx)
	return connect.NewResponse(&weirv1.DeleteAccountResponse{}), nil
}

// findAccount resolves an id or a label.
func (st store) findAccount(ctx context.Context, idOrLabel string) (db.Account, error) {
	if idOrLabel == "" {
		return db.Account{}, invalidf("id: required (an account id or label)")
	}
	if id, err := uuid.Parse(idOrLabel); err == nil {
		row, err := st.q.GetAccount(ctx, id)
		return row, storeErr(err)
	}
	row, err := st.q.GetAccountByLabel(ctx, idOrLabel)
	return row, storeErr(err)
}

// liveAccounts is the live state of every account: lease counts,
// cooldowns, family gates and usage windows.
type liveAccounts struct {
	live    map[uuid.UUID]int32
	cooling map[uuid.UUID]db.Cooldown
	// runs are the accounts' runs of transport failures (unreachable.go).
	runs  map[uuid.UUID]db.Cooldown
	gates map[uuid.UUID][]db.FamilyGate
	usage map[uuid.UUID]accountUsage
	// forecasts per account, by window.
	forecasts map[uuid.UUID][]*weirv1.Forecast
	// egressDefault is the default egress proxy as operators see it.
	egressDefault string
	// owners are the keys and teams that own accounts, by id.
	owners map[uuid.UUID]db.AccountOwnerNamesRow
	// opens says whether this replica opens an account's credential.
	opens func(db.Account) bool
}

// liveState reads live lease counts, cooldowns, family gates and usage
// windows for every account.
func (v accountViews) liveState(ctx context.Context, now time.Time) (liveAccounts, error) {
	counts, err := v.q.LiveLeaseCounts(ctx, now)
	if err != nil {
		return liveAccounts{}, err
	}
	cds, err := v.q.LiveCooldowns(ctx, now)
	if err != nil {
		return liveAccounts{}, err
	}
	gates, err := v.q.LiveFamilyGates(ctx, now)
	if err != nil {
		return liveAccounts{}, err
	}
	runs, err := v.q.TransportRuns(ctx)
	if err != nil {
		return liveAccounts{}, err
	}
	usage, err := v.usageView(ctx)
	if err != nil {
		return liveAccounts{}, err
	}
	forecasts, err := v.forecasts(ctx, now)
	if err != nil {
		return liveAccounts{}, err
	}
	egressShown, _, err := egressDefault(ctx, v.q)
	if err != nil {
		return liveAccounts{}, err
	}
	owners, err := v.q.AccountOwnerNames(ctx)
	if err != nil {
		return liveAccounts{}, err
	}
	st := liveAccounts{
		live:    make(map[uuid.UUID]int32, len(counts)),
		cooling: make(map[uuid.UUID]db.Cooldown, len(cds)),
		runs:    make(map[uuid.UUID]db.Cooldown, len(runs)),
		gates:   make(map[uuid.UUID][]db.FamilyGate),
		usage:   usage,

		forecasts:     forecasts,
		egressDefault: egressShown,
		owners:        make(map[uuid.UUID]db.AccountOwnerNamesRow, len(owners)),
		opens:         v.opens,
	}
	for _, o := range owners {
		st.owners[o.ID] = o
	}
	for _, c := range counts {
		st.live[c.AccountID] = c.Live
	}
	for _, c := range cds {
		st.cooling[c.AccountID] = c
	}
	for _, c := range runs {
		st.runs[c.AccountID] = c
	}
	for _, g := range gates {
		st.gates[g.AccountID] = append(st.gates[g.AccountID], g)
	}
	return st, nil
}

// account is r as operators see it, with its live state.
func (st liveAccounts) account(r db.Account) *weirv1.Account {
	var cd *db.Cooldown
	if c, ok := st.cooling[r.ID]; ok {
		cd = &c
	}
	if !st.opens(r) && r.BrokenAt == nil {
		// Broken for this replica now, not at its next credential check.
		r.BrokenAt, r.BrokenReason = &r.UpdatedAt, new(string)
		*r.BrokenReason = unreadableReason
	}
	a := accountProto(r, cd, st.live[r.ID])
	a.CredentialUnreadable = !st.opens(r)
	for _, g := range st.gates[r.ID] {
		a.FamilyGates = append(a.FamilyGates, familyGateProto(g))
	}
	if run, ok := st.runs[r.ID]; ok {
		a.Unreachable = unreachableOf(run, r.Provider, r.BaseUrl)
	}
	st.usage[r.ID].fill(a)
	a.Forecasts = st.forecasts[r.ID]
	a.EgressVia = egressVia(r, st.egressDefault)
	a.Owner = st.owner(r)
	return a
}

// owner is r's owner as operators see it; nil when it has none.
func (st liveAccounts) owner(r db.Account) *weirv1.AccountOwner {
	var id uuid.UUID
	kind := weirv1.OwnerKind_OWNER_KIND_KEY
	switch {
	case r.OwnerKeyID.Valid:
		id = r.OwnerKeyID.UUID
	case r.OwnerTeamID.Valid:
		id, kind = r.OwnerTeamID.UUID, weirv1.OwnerKind_OWNER_KIND_TEAM
	default:
		return nil
	}
	o := st.owners[id]
	return &weirv1.AccountOwner{Kind: kind, Id: id.String(), Name: o.Name, Revoked: o.Revoked}
}

// resolveOwner checks an UpdateAccount's owner for account row: a live
// key or a team, by name or id, of an OAuth account; none clears it.
func (st store) resolveOwner(ctx context.Context, row db.Account, o *weirv1.AccountOwner) (db.SetAccountOwnerParams, error) {
	var out db.SetAccountOwnerParams
	kind := o.GetKind()
	if kind == weirv1.OwnerKind_OWNER_KIND_UNSPECIFIED {
		if o.GetName() != "" {
			return out, invalidf("owner.kind: required with owner.name %q (key or team)", o.GetName())
		}
		return out, nil // no owner
	}
	if row.AuthKind != enumName(weirv1.AuthKind_AUTH_KIND_OAUTH) {
		return out, invalidf("owner: account %q is an API key; metered keys are not seats, only an OAuth subscription account (a Claude or ChatGPT login) can have an owner", row.Label)
	}
	if o.GetName() == "" {
		return out, invalidf("owner.name: required (the key's or team's name or id)")
	}
	switch kind {
	case weirv1.OwnerKind_OWNER_KIND_KEY:
		k, err := st.findKey(ctx, o.GetName())
		if errors.Is(err, ErrNotFound) {
			return out, invalidf("owner.name: no key %q", o.GetName())
		}
		if err != nil {
			return out, err
		}
		if k.RevokedAt != nil {
			return out, invalidf("owner.name: key %q is revoked", k.Name)
		}
		out.OwnerKeyID = uuid.NullUUID{UUID: k.ID, Valid: true}
	case weirv1.OwnerKind_OWNER_KIND_TEAM:
		t, err := st.findTeam(ctx, o.GetName())
		if err != nil {
			var ce *connect.Error
			if errors.As(err, &ce) && ce.Code() == connect.CodeNotFound {
				return out, invalidf("owner.name: no team %q", o.GetName())
			}
			return out, err
		}
		out.OwnerTeamID = uuid.NullUUID{UUID: t.ID, Valid: true}
	default:
		return out, invalidf("owner.kind: unknown value %d; want key or team, or unspecified for none", int32(kind))
	}
	return out, nil
}

func (v accountViews) accountView(ctx context.Context, row db.Account) (*weirv1.Account, error) {
	st, err := v.liveState(ctx, v.now())
	if err != nil {
		return nil, err
	}
	return st.account(row), nil
}

func accountProto(r db.Account, cd *db.Cooldown, inFlight int32) *weirv1.Account {
	a := &weirv1.Account{
		Id:                 r.ID.String(),
		Provider:           enumValue[weirv1.Provider](r.Provider),
		AuthKind:           enumValue[weirv1.AuthKind](r.AuthKind),
		Label:              r.Label,
		BaseUrl:            r.BaseUrl,
		MaxConcurrency:     r.MaxConcurrency,
		Priority:           r.Priority,
		CredentialHint:     r.CredentialHint,
		CredentialRevision: r.CredentialRevision,
		InFlight:           inFlight,
		LastUsedAt:         timestampOrNil(r.LastUsedAt),
		OverloadedAt:       timestampOrNil(r.OverloadedAt),
		LastSuccessAt:      timestampOrNil(r.LastSuccessAt),
		CreatedAt:          timestamppb.New(r.CreatedAt),
		UpdatedAt:          timestamppb.New(r.UpdatedAt),
	}
	a.BankedResetsEnabled = r.BankedResetsEnabled
	a.UpstreamAccountId = r.UpstreamAccountID
	a.Identity = r.Identity
	a.EgressProxy = r.EgressProxy
	a.AccessExpiresAt = timestampOrNil(r.AccessExpiresAt)
	a.Refreshable = r.RefreshSealed != nil
	if r.OrgID != nil {
		a.OrgId = *r.OrgID
	}
	if r.BrokenReason != nil {
		a.BrokenReason = *r.BrokenReason
	}
	if cd != nil {
		a.Cooldown = cooldownProto(*cd)
	}
	a.Check, a.CheckReason = accountCheck(r)
	a.CheckedAt = timestampOrNil(r.CheckedAt)
	switch {
	case r.BrokenAt != nil:
		a.State = weirv1.AccountState_ACCOUNT_STATE_BROKEN
	case r.Paused:
		a.State = weirv1.AccountState_ACCOUNT_STATE_PAUSED
	case cd != nil:
		a.State = weirv1.AccountState_ACCOUNT_STATE_COOLING
	default:
		a.State = weirv1.AccountState_ACCOUNT_STATE_ACTIVE
	}
	return a
}

func cooldownProto(c db.Cooldown) *weirv1.Cooldown {
	return &weirv1.Cooldown{
		Reason:    enumValue[weirv1.CooldownReason](c.Reason),
		Until:     timestamppb.New(c.Until),
		WrittenAt: timestamppb.New(c.WrittenAt),
		Transient: c.Transient,
		Evidence:  policy.EvidenceSummary(c.Evidence),
		Quota:     quotaProto(c),
	}
}

// quotaProto is the quota evidence stored with a cooldown; nil when the
// cooldown is not a quota's.
func quotaProto(c db.Cooldown) *weirv1.QuotaEvidence {
	if c.QuotaKind == nil {
		return nil
	}
	return &weirv1.QuotaEvidence{
		Kind:          enumValue[weirv1.QuotaKind](*c.QuotaKind),
		ResetsAt:      timestampOrNil(c.QuotaResetsAt),
		WindowMinutes: c.QuotaWindowMinutes,
		Message:       c.QuotaMessage,
	}
}

func familyGateProto(g db.FamilyGate) *weirv1.FamilyGate {
	return &weirv1.FamilyGate{
		Family:    g.Family,
		Until:     timestamppb.New(g.Until),
		WrittenAt: timestamppb.New(g.WrittenAt),
		Evidence:  policy.EvidenceSummary(g.Evidence),
	}
}

func timestampOrNil(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func validLabel(l string) error {
	if l == "" || len(l) > 64 || strings.TrimSpace(l) != l {
		return invalidf("label: required, at most 64 characters, no surrounding spaces")
	}
	if _, err := uuid.Parse(l); err == nil {
		return invalidf("label: must not look like an account id")
	}
	return nil
}

// validCredential admits what can travel in an HTTP header: printable
// ASCII, no spaces.
func validCredential(c string) error {
	if !upstream.TokenShaped(c) {
		return invalidf("credential: required, 8 to 8192 printable ASCII characters")
	}
	return nil
}

// upstreamAccountID is the upstream account id an account is created
// with: the request's, else the one its credential names. A Codex account
// cannot do without one.
func upstreamAccountID(p weirv1.Provider, requested, fromCredential string) (string, error) {
	id := cmp.Or(requested, fromCredential)
	if id == "" {
		if p == weirv1.Provider_PROVIDER_CODEX {
			return "", errNoCodexAccountID
		}
		return "", nil
	}
	if err := validUpstreamAccountID(id); err != nil {
		return "", err
	}
	return id, nil
}

func validBaseURL(u string) error {
	if u == "" {
		return nil
	}
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.User != nil || p.RawQuery != "" {
		return invalidf("base_url: must be an http(s) URL with a host and no credentials or query")
	}
	return nil
}
