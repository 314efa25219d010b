package dashboard

import (
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// accountRange is how far back the account page looks: its usage chart,
// its failed attempts.
const accountRange = 24 * time.Hour

// accountPageAudits is how many of the audit entries that name the
// account its page shows, the latest first; the audit log has the rest.
const accountPageAudits = 50

type accountData struct {
	Account accountView
	Chart   *accountChart
	History []historyView
	Failed  []failedView
	Events  []eventView
	Audit   []auditLine
	// AuditMore: older entries name it too (the audit log, filtered).
	AuditMore bool
}

// historyView is one cooldown or gate the account was given.
type historyView struct {
	At, Until                 time.Time
	Kind, Reason, Why, Status string
}

// auditLine is one audit entry that named the account.
type auditLine struct {
	At                        time.Time
	Actor, Procedure, Outcome string
}

// accountPage is one account: its state, its usage windows over the last
// day, every cooldown and gate it was given with the evidence, its failed
// attempts and requests, and the operators' calls that named it.
func (h *Handler) accountPage(w http.ResponseWriter, r *http.Request, s session) {
	ctx := r.Context()
	res, err := h.cfg.Accounts.GetAccount(ctx, connect.NewRequest(&weirv1.GetAccountRequest{Id: r.PathValue("id")}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	a := res.Msg.Account
	now := h.cfg.Now()
	d := accountData{Account: accountViews([]*weirv1.Account{a}, now)[0]}
	usage, err := h.cfg.Dashboard.UsageHistory(ctx, connect.NewRequest(&weirv1.UsageHistoryRequest{Range: durationpb.New(accountRange), AccountId: a.Id}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	axis := timeAxis{from: now.Add(-accountRange), to: now.Add(accountRange / forecastHorizonDivisor)}
	if c, ok := newAccountChart("a", a, usage.Msg.Series, axis, now); ok {
		d.Chart = &c
	}
	hist, err := h.cfg.Dashboard.AccountHistory(ctx, connect.NewRequest(&weirv1.AccountHistoryRequest{AccountId: a.Id}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	for _, e := range hist.Msg.Entries {
		v := historyView{At: e.At.AsTime(), Until: e.Until.AsTime(), Kind: e.Kind, Reason: enumText(e.Reason, ""), Status: statusText(e.Status)}
		for _, part := range []string{enumText(e.Class, ""), e.ErrorType, enumText(e.Rung, ""), e.Cause} {
			if part != "" && part != "none" {
				if v.Why != "" {
					v.Why += ", "
				}
				v.Why += part
			}
		}
		d.History = append(d.History, v)
	}
	n, _, _, err := h.names(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	failed, err := h.cfg.Dashboard.FailedAttempts(ctx, connect.NewRequest(&weirv1.FailedAttemptsRequest{
		Since: timestamppb.New(now.Add(-accountRange)), Until: timestamppb.New(now), AccountId: a.Id}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	for _, c := range failed.Msg.Counts {
		d.Failed = append(d.Failed, failedView{Account: a.Label, AccountID: a.Id, Status: statusText(c.Status),
			Class: enumText(c.Class.String(), "OUTCOME_CLASS_"), Error: c.ErrorType, Attempts: c.Attempts, Latest: c.Latest.AsTime()})
	}
	events, err := h.cfg.Dashboard.SearchRouteEvents(ctx, connect.NewRequest(&weirv1.SearchRouteEventsRequest{AccountId: a.Id, Limit: 20}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	for _, e := range events.Msg.Events {
		d.Events = append(d.Events, newEventView(e, n, now))
	}
	// A call's target is the id it named, with the label when known
	// ("ID (label)"), or the label alone.
	audit, err := h.cfg.Audit.ListAuditEvents(ctx, connect.NewRequest(&weirv1.ListAuditEventsRequest{
		PageSize: accountPageAudits, Targets: []string{a.Id, a.Label}}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	for _, e := range audit.Msg.Events {
		d.Audit = append(d.Audit, auditLine{At: e.At.AsTime(), Actor: e.Actor, Procedure: e.Procedure, Outcome: e.Outcome})
	}
	d.AuditMore = audit.Msg.NextPageToken != ""
	h.render(w, r, http.StatusOK, "account", view{Title: "Account " + a.Label, Nav: "accounts", CSRF: s.csrf, Role: s.role, Data: d})
}
