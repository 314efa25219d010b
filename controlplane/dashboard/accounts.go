package dashboard

import (
	"cmp"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/poolstatus"
)

// accountView is one account as the accounts page shows it.
type accountView struct {
	ID, Label, Provider, AuthKind string
	// Identity is what identifies the credential without revealing it:
	// the masked hint, and the ChatGPT account id for Codex.
	Identity []string
	// Egress is what the account's traffic goes through, by
	// scheme://host:port: "" when direct and nothing else was asked.
	Egress string
	// Owner is whose seat the account is: "key NAME" or "team NAME" ("" when
	// it has none), with "(revoked)" after a revoked key.
	Owner string
	// State is active, cooling, paused or broken; spent for one cooling
	// out of quota, overloaded for an active one whose last answer was
	// overloaded (OverloadedAt).
	State        string
	OverloadedAt *time.Time
	BrokenWhy    string
	// Check is the check's verdict (good, unverified, broken); CheckWhy
	// why an unverified one is not decided yet.
	Check, CheckWhy string
	Cooldown        *cooldownView
	Usage           []usageView
	Gates           []gateView
	InFlight        int32
	MaxConc         int32
	LastSuccess     *time.Time
	LastUsed        *time.Time
	// Actions offered: pause or resume, and clear cooldown.
	Paused   bool
	CanClear bool
	// PauseWarning says which surfaces a pause would leave with no account
	// that can serve (pauseWarning); "" when none.
	PauseWarning string
}

type cooldownView struct {
	Reason, Evidence, Quota string
	Until                   time.Time
	Transient               bool
}

type usageView struct {
	Window      string
	Utilization float64
	ResetsAt    *time.Time
	// Full is the forecast: when the window is exhausted at the current
	// burn; nil when it will not be before its reset.
	Full *time.Time
	Burn float64
}

type gateView struct {
	Family, Evidence string
	Until            time.Time
}

func accountViews(accts []*weirv1.Account, now time.Time) []accountView {
	out := make([]accountView, 0, len(accts))
	serving := servingNow(accts)
	for _, a := range accts {
		v := accountView{
			ID:          a.Id,
			Label:       a.Label,
			Provider:    enumText(a.Provider.String(), "PROVIDER_"),
			AuthKind:    enumText(a.AuthKind.String(), "AUTH_KIND_"),
			State:       enumText(a.State.String(), "ACCOUNT_STATE_"),
			BrokenWhy:   a.BrokenReason,
			Check:       enumText(a.Check.String(), "ACCOUNT_CHECK_"),
			InFlight:    a.InFlight,
			MaxConc:     a.MaxConcurrency,
			LastSuccess: tsPtr(a.LastSuccessAt),
			LastUsed:    tsPtr(a.LastUsedAt),
			Paused:      a.State == weirv1.AccountState_ACCOUNT_STATE_PAUSED,
			CanClear:    a.Cooldown != nil || len(a.FamilyGates) > 0,
		}
		if a.CredentialHint != "" {
			v.Identity = append(v.Identity, a.CredentialHint)
		}
		if a.UpstreamAccountId != "" {
			v.Identity = append(v.Identity, "account "+a.UpstreamAccountId)
		}
		if a.Check == weirv1.AccountCheck_ACCOUNT_CHECK_UNVERIFIED {
			v.CheckWhy = a.CheckReason
		}
		v.Egress = egressText(a)
		v.Owner = ownerText(a.Owner)
		if c := a.Cooldown; c != nil {
			cv := &cooldownView{Reason: enumText(c.Reason.String(), "COOLDOWN_REASON_"), Evidence: c.Evidence,
				Until: c.Until.AsTime(), Transient: c.Transient}
			if q := c.Quota; q != nil {
				cv.Quota = cmp.Or(q.Message, enumText(q.Kind.String(), "QUOTA_KIND_"))
			}
			v.Cooldown = cv
		}
		for _, g := range a.FamilyGates {
			v.Gates = append(v.Gates, gateView{Family: g.Family, Evidence: g.Evidence, Until: g.Until.AsTime()})
		}
		forecasts := map[string]*weirv1.Forecast{}
		for _, f := range a.Forecasts {
			forecasts[f.Window] = f
		}
		for _, u := range a.Usage {
			if u.Utilization == nil {
				continue
			}
			uv := usageView{Window: windowText(u.Window), Utilization: *u.Utilization, ResetsAt: tsPtr(u.ResetsAt)}
			if f := forecasts[u.Window]; f != nil {
				uv.Burn = f.BurnPerHour
				uv.Full = tsPtr(f.ExhaustsAt)
			}
			v.Usage = append(v.Usage, uv)
		}
		slices.SortFunc(v.Usage, func(a, b usageView) int { return cmp.Compare(windowOrder(a.Window), windowOrder(b.Window)) })
		v.PauseWarning = pauseWarning(a, serving)
		switch a.State {
		case weirv1.AccountState_ACCOUNT_STATE_BROKEN:
			// A broken account serves nothing until an operator acts: its
			// windows, gates and cooldown are beside the point.
			v.Usage, v.Gates, v.Cooldown = nil, nil, nil
		case weirv1.AccountState_ACCOUNT_STATE_PAUSED:
		default:
			if c := a.Cooldown; c != nil && spentReason(c.Reason) {
				// Out of quota: "spent" says it plainly, its cooldown when
				// it is back.
				v.State = "spent"
			} else if a.State == weirv1.AccountState_ACCOUNT_STATE_ACTIVE && poolstatus.Overloaded(a, now) {
				// Active, but its last answer was overloaded: not green.
				v.State, v.OverloadedAt = "overloaded", tsPtr(a.OverloadedAt)
			}
		}
		out = append(out, v)
	}
	return out
}

// ownerText is an account's owner as its row shows it.
func ownerText(o *weirv1.AccountOwner) string {
	if o == nil {
		return ""
	}
	s := enumText(o.Kind.String(), "OWNER_KIND_") + " " + cmp.Or(o.Name, o.Id)
	if o.Revoked {
		s += " (revoked)"
	}
	return s
}

// egressText is an account's egress as its row shows it.
func egressText(a *weirv1.Account) string {
	switch {
	case a.EgressProxy == "direct":
		return "direct (bypasses the default proxy)"
	case a.EgressProxy != "":
		return a.EgressProxy
	case a.EgressVia != "":
		return a.EgressVia + " (default)"
	}
	return ""
}

func windowOrder(w string) int {
	switch w {
	case "5h":
		return 0
	case "weekly":
		return 1
	}
	return 2
}

type accountsData struct {
	Accounts []accountView
	Pool     poolHeader
	Flash    string
	Error    string
	Now      time.Time
}

func (h *Handler) accountsData(r *http.Request) (accountsData, error) {
	ctx := r.Context()
	res, err := h.cfg.Accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		return accountsData{}, err
	}
	now := h.cfg.Now()
	d := accountsData{Accounts: accountViews(res.Msg.Accounts, now), Now: now}
	// The pool header: what `weir status` says, from the same answers.
	settings, err := h.cfg.Settings.GetSettings(ctx, connect.NewRequest(&weirv1.GetSettingsRequest{}))
	if err != nil {
		return d, err
	}
	integrity, err := h.cfg.Ops.LastIntegrityReport(ctx, connect.NewRequest(&weirv1.LastIntegrityReportRequest{}))
	if err != nil {
		return d, err
	}
	held, err := h.cfg.Routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 1000, HeldOnly: true}))
	if err != nil {
		return d, err
	}
	breakers, err := h.cfg.Ops.ListBreakers(ctx, connect.NewRequest(&weirv1.ListBreakersRequest{}))
	if err != nil {
		return d, err
	}
	st := poolstatus.Build(res.Msg.Accounts, settings.Msg.Settings, integrity.Msg.Report, now)
	st.Held = poolstatus.HeldNow(held.Msg.Events, now)
	st.Breakers = poolstatus.Breakers(breakers.Msg.Breakers)
	d.Pool = newPoolHeader(st, res.Msg.Accounts, d.Accounts)
	return d, nil
}

// poolHeader is the accounts page's first lines: what can serve now per
// provider, the next recovery, the pooled windows with their runway, the
// requests held now, the open breakers, and what is wrong.
type poolHeader struct {
	Providers []providerLine
	// NextBack is the soonest a cooling account comes back; zero when none
	// is cooling.
	NextBack      time.Time
	NextBackLabel string
	Held          int
	HeldLongest   time.Duration
	Breakers      []poolstatus.Breaker
	Problems      []problemLine
}

type providerLine struct {
	poolstatus.Provider
	// Runway is when the first of its active accounts' five-hour or weekly
	// window fills at its current burn (the forecast); zero when none does.
	Runway time.Time
}

type problemLine struct {
	poolstatus.Problem
	// AccountID links the problem to its account's page.
	AccountID string
}

func newPoolHeader(st poolstatus.Status, accts []*weirv1.Account, views []accountView) poolHeader {
	ph := poolHeader{Breakers: st.Breakers}
	ids := map[string]string{}
	for _, a := range accts {
		ids[a.Label] = a.Id
	}
	runway := map[string]time.Time{}
	for _, v := range views {
		if v.Cooldown != nil && (ph.NextBack.IsZero() || v.Cooldown.Until.Before(ph.NextBack)) {
			ph.NextBack, ph.NextBackLabel = v.Cooldown.Until, v.Label
		}
		if v.State != "active" {
			continue
		}
		for _, u := range v.Usage {
			if u.Full != nil && (runway[v.Provider].IsZero() || u.Full.Before(runway[v.Provider])) {
				runway[v.Provider] = *u.Full
			}
		}
	}
	for _, p := range st.Providers {
		ph.Providers = append(ph.Providers, providerLine{Provider: p, Runway: runway[p.Provider]})
	}
	for _, hs := range st.Held {
		ph.Held += hs.Requests
		ph.HeldLongest = max(ph.HeldLongest, poolstatus.RoundDuration(hs.Longest))
	}
	for _, p := range st.Problems {
		ph.Problems = append(ph.Problems, problemLine{Problem: p, AccountID: ids[p.Account]})
	}
	return ph
}

func (h *Handler) accountsPage(w http.ResponseWriter, r *http.Request, s session) {
	d, err := h.accountsData(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	if done, label := q.Get("done"), q.Get("account"); done != "" {
		if a, ok := actions[done]; ok {
			d.Flash = a.done + " " + label + "."
		}
	}
	h.render(w, r, http.StatusOK, "accounts", view{Title: "Accounts", Nav: "accounts", CSRF: s.csrf, Role: s.role, Data: d})
}

func (h *Handler) accountsFragment(w http.ResponseWriter, r *http.Request, s session) {
	d, err := h.accountsData(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.execute(w, r, http.StatusOK, "accounts", "accounts-table", view{CSRF: s.csrf, Role: s.role, Data: d})
}

// action is an operator action on an account.
type action struct {
	// verb is the button, done the flash after it, what the confirmation.
	verb, done, what string
	call             func(h *Handler, r *http.Request, id string) error
}

var actions = map[string]action{
	"pause": {"Pause", "Paused", "Routing stops sending new requests to this account until you resume it. Requests already running finish.",
		func(h *Handler, r *http.Request, id string) error {
			_, err := h.cfg.Accounts.PauseAccount(r.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: id}))
			return err
		}},
	"resume": {"Resume", "Resumed", "The account returns to routing, and its cooldown, family gates and broken mark are cleared.",
		func(h *Handler, r *http.Request, id string) error {
			_, err := h.cfg.Accounts.ResumeAccount(r.Context(), connect.NewRequest(&weirv1.ResumeAccountRequest{Id: id}))
			return err
		}},
	"clear-cooldown": {"Clear cooldown", "Cleared the cooldown of", "The live cooldown and every family gate are deleted, so routing may try the account at once. A paused account stays paused.",
		func(h *Handler, r *http.Request, id string) error {
			_, err := h.cfg.Dashboard.ClearCooldown(r.Context(), connect.NewRequest(&weirv1.ClearCooldownRequest{Id: id}))
			return err
		}},
}

type confirmData struct {
	Account            accountView
	Action, Verb, What string
	// Warning is what the action leaves without an account (pauseWarning).
	Warning string
	Error   string
}

// confirmPage asks before an action: the no-JavaScript path, and where the
// dialog's form posts back to on an error.
func (h *Handler) confirmPage(w http.ResponseWriter, r *http.Request, s session) {
	a, ok := actions[r.PathValue("action")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	res, err := h.cfg.Accounts.GetAccount(r.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: r.PathValue("id")}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := confirmData{Account: accountViews([]*weirv1.Account{res.Msg.Account}, h.cfg.Now())[0], Action: r.PathValue("action"), Verb: a.verb, What: a.what}
	if d.Action == "pause" {
		all, err := h.cfg.Accounts.ListAccounts(r.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
		if err != nil {
			h.fail(w, r, err)
			return
		}
		d.Warning = pauseWarning(res.Msg.Account, servingNow(all.Msg.Accounts))
	}
	h.render(w, r, http.StatusOK, "confirm", view{Title: a.verb, Nav: "accounts", CSRF: s.csrf, Role: s.role, Data: d})
}

func (h *Handler) accountAction(w http.ResponseWriter, r *http.Request, s session) {
	name := r.PathValue("action")
	a, ok := actions[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	id := r.PathValue("id")
	res, err := h.cfg.Accounts.GetAccount(r.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: id}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	acct := res.Msg.Account
	if err := a.call(h, r, acct.Id); err != nil {
		h.render(w, r, http.StatusUnprocessableEntity, "confirm", view{Title: a.verb, Nav: "accounts", CSRF: s.csrf, Role: s.role, Data: confirmData{
			Account: accountViews([]*weirv1.Account{acct}, h.cfg.Now())[0], Action: name, Verb: a.verb, What: a.what, Error: rpcMessage(err)}})
		return
	}
	h.cfg.Logger.InfoContext(r.Context(), "dashboard action", "action", name, "account_id", acct.Id)
	http.Redirect(w, r, Prefix+"?done="+name+"&account="+url.QueryEscape(acct.Label), http.StatusSeeOther)
}

// surfaceNames name the client surfaces for an operator.
var surfaceNames = []struct {
	sf   weirv1.Surface
	name string
}{
	{weirv1.Surface_SURFACE_MESSAGES, "Messages (Claude Code)"},
	{weirv1.Surface_SURFACE_RESPONSES, "Responses (Codex)"},
	{weirv1.Surface_SURFACE_CHAT_COMPLETIONS, "Chat Completions"},
}

// servingNow counts, per surface, the active accounts of the providers
// serving it.
func servingNow(accts []*weirv1.Account) map[weirv1.Surface]int {
	n := map[weirv1.Surface]int{}
	for _, a := range accts {
		if a.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
			continue
		}
		for _, s := range surfaceNames {
			if policy.Serves(a.Provider, s.sf) {
				n[s.sf]++
			}
		}
	}
	return n
}

// pauseWarning says which surfaces pausing a would leave with no account
// that can serve now ("" when none), given servingNow's counts: it is the
// last active account of every provider serving them.
func pauseWarning(a *weirv1.Account, serving map[weirv1.Surface]int) string {
	if a.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
		return ""
	}
	var left []string
	for _, s := range surfaceNames {
		if policy.Serves(a.Provider, s.sf) && serving[s.sf] == 1 {
			left = append(left, s.name)
		}
	}
	if len(left) == 0 {
		return ""
	}
	return "It is the last account that can serve " + strings.Join(left, " and ") + " now: those clients get no account until another recovers or is resumed."
}

// spentReason says whether a cooldown is the account's quota running out.
func spentReason(r weirv1.CooldownReason) bool {
	return r == weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED || r == weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS
}
