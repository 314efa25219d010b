package dashboard

import (
	"cmp"
	"net/http"
	"net/url"
	"slices"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
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
	// State is active, cooling, paused or broken.
	State     string
	BrokenWhy string
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

func accountViews(accts []*weirv1.Account) []accountView {
	out := make([]accountView, 0, len(accts))
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
	Flash    string
	Error    string
	Now      time.Time
}

func (h *Handler) accountsData(r *http.Request) (accountsData, error) {
	res, err := h.cfg.Accounts.ListAccounts(r.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		return accountsData{}, err
	}
	return accountsData{Accounts: accountViews(res.Msg.Accounts), Now: h.cfg.Now()}, nil
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
	h.render(w, r, http.StatusOK, "accounts", view{Title: "Accounts", Nav: "accounts", CSRF: s.csrf, Data: d})
}

func (h *Handler) accountsFragment(w http.ResponseWriter, r *http.Request, s session) {
	d, err := h.accountsData(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.execute(w, r, http.StatusOK, "accounts", "accounts-table", view{CSRF: s.csrf, Data: d})
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
	Error              string
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
	h.render(w, r, http.StatusOK, "confirm", view{Title: a.verb, Nav: "accounts", CSRF: s.csrf, Data: confirmData{
		Account: accountViews([]*weirv1.Account{res.Msg.Account})[0], Action: r.PathValue("action"), Verb: a.verb, What: a.what}})
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
		h.render(w, r, http.StatusUnprocessableEntity, "confirm", view{Title: a.verb, Nav: "accounts", CSRF: s.csrf, Data: confirmData{
			Account: accountViews([]*weirv1.Account{acct})[0], Action: name, Verb: a.verb, What: a.what, Error: rpcMessage(err)}})
		return
	}
	h.cfg.Logger.InfoContext(r.Context(), "dashboard action", "action", name, "account_id", acct.Id)
	http.Redirect(w, r, Prefix+"?done="+name+"&account="+url.QueryEscape(acct.Label), http.StatusSeeOther)
}
