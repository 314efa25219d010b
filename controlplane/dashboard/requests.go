package dashboard

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// requestFilter is the requests page's query string: the filters, the
// range of start times (a preset, ranges), and the page (a token from the
// page before).
type requestFilter struct {
	Key, Account, Model, Outcome, Status, Session, Range, Page string
}

func parseFilter(q url.Values) requestFilter {
	return requestFilter{Key: q.Get("key"), Account: q.Get("account"), Model: strings.TrimSpace(q.Get("model")),
		Outcome: q.Get("outcome"), Status: strings.TrimSpace(q.Get("status")), Session: q.Get("session"),
		Range: q.Get("range"), Page: q.Get("page")}
}

// requestRanges are the requests page's time ranges, back from now; "" is
// any time (the failed attempts then cover the last hour).
var requestRanges = map[string]time.Duration{"1h": time.Hour, "6h": 6 * time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

// values is the filter as a query, less the page.
func (f requestFilter) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"key": f.Key, "account": f.Account, "model": f.Model, "outcome": f.Outcome,
		"status": f.Status, "session": f.Session, "range": f.Range} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// Query is the filter as a query string, for the fragment's URL.
func (f requestFilter) Query() string {
	v := f.values()
	if f.Page != "" {
		v.Set("page", f.Page)
	}
	return v.Encode()
}

// With is the filter's query with one field changed (a link to the next
// page, to one session's requests); "" drops it.
func (f requestFilter) With(key, value string) template.URL {
	v := f.values()
	if value == "" {
		v.Del(key)
	} else {
		v.Set(key, value)
	}
	return template.URL(v.Encode()) //nolint:gosec // url.Values encoded it
}

var outcomes = map[string]weirv1.RouteOutcome{
	"success": weirv1.RouteOutcome_ROUTE_OUTCOME_SUCCESS,
	"error":   weirv1.RouteOutcome_ROUTE_OUTCOME_ERROR,
	"held":    weirv1.RouteOutcome_ROUTE_OUTCOME_HELD,
}

// eventView is one route event in the list.
type eventView struct {
	RequestID, Key, Account, Model, Surface, Error string
	// Session is the conversation's key; SessionShort its head, shown.
	Session, SessionShort     string
	Status, Attempts, Holds   int32
	Started                   time.Time
	Duration, TTFB, Held      string
	InputTokens, OutputTokens int64
	Stream, OK                bool
	// StatusText is the status as shown: "held" or "in progress" while
	// the request goes on, "200, failed mid-stream" for a stream cut
	// after output (a failure, not a 200).
	StatusText string
	// Pending: still in progress. HeldNow says how long it has been held,
	// why and its next try, while it is held. Verdict is why a failure
	// was answered.
	Pending          bool
	HeldNow, Verdict string
}

// newEventView is one route event as the pages show it, at now.
func newEventView(e *weirv1.RouteEvent, n names, now time.Time) eventView {
	v := eventView{
		RequestID: e.RequestId, Key: n.key(e.KeyId), Account: n.account(e.AccountId), Model: e.Model,
		Surface: e.Surface, Error: e.ErrorType, Status: e.Status, Attempts: e.Attempts, Holds: e.HoldCount,
		Started: e.StartedAt.AsTime(), Duration: durText(e.Duration), TTFB: durText(e.TimeToFirstByte), Held: durText(e.Held),
		InputTokens: e.InputTokens, OutputTokens: e.OutputTokens, Stream: e.Stream, Pending: e.Pending, Verdict: e.Verdict,
		StatusText: fmt.Sprint(e.Status), Session: e.SessionKey, SessionShort: shortSession(e.SessionKey),
	}
	cut := e.FailureStage == weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT
	v.OK = e.Status >= 200 && e.Status < 300 && !cut && !e.Pending
	switch {
	case e.Pending && e.HeldSince != nil:
		v.StatusText, v.Error = "held", ""
		v.HeldNow = fmt.Sprintf("for %s, %d attempts so far", now.Sub(e.HeldSince.AsTime()).Round(time.Second), e.Attempts)
		if e.NextTryAt != nil {
			if d := e.NextTryAt.AsTime().Sub(now); d > 0 {
				v.HeldNow += ", next try in " + d.Round(100*time.Millisecond).String()
			}
		}
		if e.HoldReason != "" {
			v.HeldNow += ": " + e.HoldReason
		}
	case e.Pending:
		v.StatusText, v.Error = "in progress", ""
	case cut:
		v.StatusText = fmt.Sprintf("%d, failed mid-stream", e.Status)
	}
	return v
}

// shortSession is a session key's head: enough to tell twenty agents
// of one key apart.
func shortSession(k string) string {
	if len(k) > 12 {
		return k[:12] + "…"
	}
	return k
}

type option struct{ Value, Label string }

type requestsData struct {
	Filter   requestFilter
	Events   []eventView
	Keys     []option
	Accounts []option
	Error    string
	// Next is the token of the next (older) page; "" on the last.
	Next string
	// Failed are the failed attempts of the range (the last hour when the
	// range is any time), and FailedRange names it.
	Failed      []failedView
	FailedRange string
}

// failedView is one row of the failed attempts: an account, a way an
// attempt failed, how often and when last.
type failedView struct {
	Account, AccountID, Status, Class, Error string
	Attempts                                 int64
	Latest                                   time.Time
}

// names maps account and key ids to labels and names.
type names struct{ accounts, keys map[string]string }

func (h *Handler) names(r *http.Request) (names, []option, []option, error) {
	n := names{accounts: map[string]string{}, keys: map[string]string{}}
	accts, err := h.cfg.Accounts.ListAccounts(r.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		return n, nil, nil, err
	}
	keys, err := h.cfg.Keys.ListKeys(r.Context(), connect.NewRequest(&weirv1.ListKeysRequest{IncludeRevoked: true}))
	if err != nil {
		return n, nil, nil, err
	}
	var ao, ko []option
	for _, a := range accts.Msg.Accounts {
		n.accounts[a.Id] = a.Label
		ao = append(ao, option{a.Id, a.Label})
	}
	for _, k := range keys.Msg.Keys {
		n.keys[k.Id] = k.Name
		ko = append(ko, option{k.Id, k.Name})
	}
	return n, ao, ko, nil
}

func (n names) account(id string) string {
	if id == "" {
		return "-"
	}
	if l, ok := n.accounts[id]; ok {
		return l
	}
	return id
}

func (n names) key(id string) string {
	if id == "" {
		return "-"
	}
	if l, ok := n.keys[id]; ok {
		return l
	}
	return id
}

// requestsData reads the page's requests; with failed, the failed attempts
// of its range too: the page reads them once, the live fragment (every few
// seconds) does not read a range's attempt records again.
func (h *Handler) requestsData(r *http.Request, failed bool) (requestsData, int, error) {
	f := parseFilter(r.URL.Query())
	n, ao, ko, err := h.names(r)
	if err != nil {
		return requestsData{}, 0, err
	}
	d := requestsData{Filter: f, Accounts: ao, Keys: ko}
	req := &weirv1.SearchRouteEventsRequest{Limit: 100, AccountId: f.Account, KeyId: f.Key, Model: f.Model,
		SessionKey: f.Session, PageToken: f.Page}
	now := h.cfg.Now()
	since := now.Add(-time.Hour)
	d.FailedRange = "the last hour"
	if f.Range != "" {
		rng, ok := requestRanges[f.Range]
		if !ok {
			d.Error = "range: want 1h, 6h, 24h or 7d"
			return d, http.StatusBadRequest, nil
		}
		since = now.Add(-rng)
		req.Since = timestamppb.New(since)
		d.FailedRange = "the last " + f.Range
	}
	if f.Outcome != "" {
		o, ok := outcomes[f.Outcome]
		if !ok {
			d.Error = "outcome: want success, error or held"
			return d, http.StatusBadRequest, nil
		}
		req.Outcome = o
	}
	if f.Status != "" {
		st, err := strconv.Atoi(f.Status)
		if err != nil {
			d.Error = "status: want an HTTP status such as 429"
			return d, http.StatusBadRequest, nil
		}
		req.Status = int32(st)
	}
	res, err := h.cfg.Dashboard.SearchRouteEvents(r.Context(), connect.NewRequest(req))
	if err != nil {
		if c := connect.CodeOf(err); c == connect.CodeInvalidArgument || c == connect.CodeNotFound {
			d.Error = rpcMessage(err)
			return d, http.StatusBadRequest, nil
		}
		return d, 0, err
	}
	for _, e := range res.Msg.Events {
		d.Events = append(d.Events, newEventView(e, n, now))
	}
	d.Next = res.Msg.NextPageToken
	if !failed {
		return d, http.StatusOK, nil
	}
	counts, err := h.cfg.Dashboard.FailedAttempts(r.Context(), connect.NewRequest(&weirv1.FailedAttemptsRequest{
		Since: timestamppb.New(since), Until: timestamppb.New(now)}))
	if err != nil {
		return d, 0, err
	}
	for _, c := range counts.Msg.Counts {
		d.Failed = append(d.Failed, failedView{Account: n.account(c.AccountId), AccountID: c.AccountId, Status: statusText(c.Status),
			Class: enumText(c.Class.String(), "OUTCOME_CLASS_"), Error: c.ErrorType, Attempts: c.Attempts, Latest: c.Latest.AsTime()})
	}
	return d, http.StatusOK, nil
}

// statusText is an attempt's status, "-" for none (no answer came).
func statusText(s int32) string {
	if s == 0 {
		return "-"
	}
	return strconv.Itoa(int(s))
}

func (h *Handler) requestsPage(w http.ResponseWriter, r *http.Request, s session) {
	d, status, err := h.requestsData(r, true)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, status, "requests", view{Title: "Requests", Nav: "requests", CSRF: s.csrf, Role: s.role, Data: d})
}

func (h *Handler) requestsFragment(w http.ResponseWriter, r *http.Request, s session) {
	d, status, err := h.requestsData(r, false)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.execute(w, r, status, "requests", "requests-table", view{CSRF: s.csrf, Role: s.role, Data: d})
}

// stepView is one attempt or hold of a request's timeline.
type stepView struct {
	At, Account, Outcome, Status, Error, Decision, Duration, Reason string
	AccountID                                                       string
	Hold                                                            bool
}

type explainData struct {
	Event eventView
	Stage string
	Steps []stepView
}

// explainPage is `weir explain` in the browser: the request's outcome and
// its timeline of attempts and holds.
func (h *Handler) explainPage(w http.ResponseWriter, r *http.Request, s session) {
	res, err := h.cfg.Routes.GetRouteEvent(r.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: r.PathValue("id")}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	n, _, _, err := h.names(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	e := res.Msg.Event
	d := explainData{
		Event: newEventView(e, n, h.cfg.Now()),
		Stage: enumText(e.FailureStage.String(), "FAILURE_STAGE_"),
	}
	for _, a := range e.AttemptRecords {
		st := stepView{At: "+" + durText(a.At), Duration: durText(a.Duration)}
		if a.AccountId == "" {
			st.Hold, st.Account, st.Reason = true, "hold", a.HoldReason
		} else {
			st.Account, st.AccountID = n.account(a.AccountId), a.AccountId
			st.Outcome = enumText(a.Class.String(), "OUTCOME_CLASS_")
			st.Decision = enumText(a.Action.String(), "ACTION_")
			st.Error = a.ErrorType
			if a.TransportCause != weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED {
				// The error of an attempt that got no answer is its cause.
				st.Error = enumText(a.TransportCause.String(), "TRANSPORT_CAUSE_")
				if a.TransportCause == weirv1.TransportCause_TRANSPORT_CAUSE_PROXY && a.TransportError != "" {
					// It names the proxy (scheme://host:port).
					st.Error = a.TransportError
				}
			}
			var reasons []string
			if a.Rung != "" {
				reasons = append(reasons, "429 ladder: "+strings.ReplaceAll(a.Rung, "_", " "))
			}
			if a.Translation != "" {
				reasons = append(reasons, "translated "+strings.ReplaceAll(a.Translation, ">", " → ")+" as "+a.Model)
			}
			st.Reason = strings.Join(reasons, "; ")
			if a.Status != 0 {
				st.Status = fmt.Sprint(a.Status)
			}
		}
		d.Steps = append(d.Steps, st)
	}
	h.render(w, r, http.StatusOK, "explain", view{Title: "Request " + e.RequestId, Nav: "requests", CSRF: s.csrf, Role: s.role, Data: d})
}
