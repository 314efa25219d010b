package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"riverqueue.com/riverui"

	"github.com/weirhq/weir/controlplane/dashboard"
	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// The operator dashboard: the UI lives in package dashboard, which sees the
// control plane only through its Connect services, called in process (a
// service handler has the method set of its client). DashboardService
// holds the few RPCs the dashboard needs beyond the CLI's.

// Bounds of the history ranges, and how many buckets a chart is thinned to.
const (
	minHistoryRange = time.Hour
	maxHistoryRange = 14 * 24 * time.Hour
	historyBuckets  = 120
)

// dashboardHandler serves the dashboard under /dashboard/, River's UI under
// /dashboard/jobs/ when this replica runs jobs. The dashboard calls the
// services through rpc in process: the same interceptors as the CLI's, so
// its changes are audited, with its session as the actor.
func (s *Server) dashboardHandler(rpc http.Handler) http.Handler {
	hc := &http.Client{Transport: inProcess{h: rpc}}
	const base = "http://in-process"
	cfg := dashboard.Config{
		AdminToken:     s.cfg.AdminToken,
		Sessions:       sessionStore{q: s.q},
		Roles:          s.cfg.oidcRoles,
		OIDC:           s.oidc,
		TrustedProxies: s.cfg.TrustedProxies,
		Accounts:       weirv1connect.NewAccountServiceClient(hc, base),
		Keys:           weirv1connect.NewKeyServiceClient(hc, base),
		Routes:         weirv1connect.NewRouteServiceClient(hc, base),
		Settings:       weirv1connect.NewSettingsServiceClient(hc, base),
		Aliases:        weirv1connect.NewAliasServiceClient(hc, base),
		Dashboard:      weirv1connect.NewDashboardServiceClient(hc, base),
		Audit:          weirv1connect.NewAuditServiceClient(hc, base),
		Usage:          weirv1connect.NewUsageServiceClient(hc, base),
		Ops:            weirv1connect.NewOpsServiceClient(hc, base),
		Now:            s.now,
		Logger:         s.log,
	}
	if s.river != nil {
		jobs, err := riverui.NewHandler(&riverui.HandlerOpts{
			Endpoints: riverui.NewEndpoints(s.river, nil),
			Logger:    s.log.With("component", "riverui"),
			Prefix:    dashboard.JobsPrefix,
		})
		if err != nil {
			// The dashboard still serves; the jobs page says why not.
			s.log.Error("river ui unavailable", "err", err)
		} else {
			cfg.Jobs = jobs
		}
	}
	return dashboard.New(cfg)
}

// inProcess serves a client's request with h, in this process: no socket,
// no token. It carries the dashboard session's principal (who, how signed
// in, their role) in the context, where the token interceptor takes it,
// and the browser's address. A call outside a dashboard request carries
// no principal and is refused.
type inProcess struct {
	h http.Handler
}

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	peer := "in-process"
	if c, ok := dashboard.CallerOf(ctx); ok {
		ctx = withPrincipal(ctx, principal{name: cleanActor(c.Actor), credential: c.Credential, role: c.Role})
		peer = c.Peer
	}
	r = r.Clone(ctx)
	r.Header.Del("Authorization")
	r.RemoteAddr = peer
	r.RequestURI = r.URL.RequestURI()
	if r.Body == nil {
		r.Body = http.NoBody
	}
	w := &bufferedResponse{header: http.Header{}, status: http.StatusOK}
	t.h.ServeHTTP(w, r)
	return &http.Response{
		Status: http.StatusText(w.status), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.header, Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()),
		Request: r,
	}, nil
}

// bufferedResponse is the http.ResponseWriter of an in-process call.
type bufferedResponse struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(code int) {
	if !b.wroteHeader {
		b.status, b.wroteHeader = code, true
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.wroteHeader = true
	return b.body.Write(p)
}

type dashboardService struct {
	weirv1connect.UnimplementedDashboardServiceHandler
	store
	now   func() time.Time
	log   *slog.Logger
	views accountViews
}

func (d dashboardService) ClearCooldown(ctx context.Context, req *connect.Request[weirv1.ClearCooldownRequest]) (*connect.Response[weirv1.ClearCooldownResponse], error) {
	row, err := d.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	n, err := d.q.ClearAccountCooldowns(ctx, row.ID)
	if err != nil {
		return nil, err
	}
	d.log.InfoContext(ctx, "account cooldown cleared", "account_id", row.ID, "cooldowns", n.Cooldowns, "family_gates", n.Gates)
	acct, err := d.views.accountView(ctx, row)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.ClearCooldownResponse{Account: acct, ClearedCooldown: n.Cooldowns > 0, ClearedGates: n.Gates}), nil
}

func (d dashboardService) SearchRouteEvents(ctx context.Context, req *connect.Request[weirv1.SearchRouteEventsRequest]) (*connect.Response[weirv1.SearchRouteEventsResponse], error) {
	m := req.Msg
	limit, err := pageLimit("limit", m.Limit, 50, 1000)
	if err != nil {
		return nil, err
	}
	p := db.SearchRouteEventsParams{MaxRows: limit + 1} // one more says there is a next page
	if m.PageToken != "" {
		at, id, err := parsePageToken(m.PageToken)
		if err != nil {
			return nil, err
		}
		p.BeforeAt, p.BeforeID = &at, pgtype.Int8{Int64: id, Valid: true}
	}
	if m.Since != nil {
		t := m.Since.AsTime()
		p.Since = &t
	}
	if m.Until != nil {
		t := m.Until.AsTime()
		p.Until = &t
	}
	if m.SessionKey != "" {
		p.SessionKey = &m.SessionKey
	}
	if m.AccountId != "" {
		acct, err := d.findAccount(ctx, m.AccountId)
		if err != nil {
			return nil, err
		}
		p.AccountID = uuid.NullUUID{UUID: acct.ID, Valid: true}
	}
	if m.KeyId != "" {
		var key db.ClientKey
		var err error
		if id, perr := uuid.Parse(m.KeyId); perr == nil {
			key, err = d.q.GetKey(ctx, id)
		} else {
			key, err = d.q.GetKeyByName(ctx, m.KeyId)
		}
		if err != nil {
			return nil, storeErr(err)
		}
		p.KeyID = uuid.NullUUID{UUID: key.ID, Valid: true}
	}
	if m.Model != "" {
		p.Model = &m.Model
	}
	if m.Status != 0 {
		if m.Status < 100 || m.Status > 599 {
			return nil, invalidf("status: %d is not an HTTP status", m.Status)
		}
		p.Status = &m.Status
	}
	switch m.Outcome {
	case weirv1.RouteOutcome_ROUTE_OUTCOME_UNSPECIFIED:
	case weirv1.RouteOutcome_ROUTE_OUTCOME_SUCCESS, weirv1.RouteOutcome_ROUTE_OUTCOME_ERROR, weirv1.RouteOutcome_ROUTE_OUTCOME_HELD:
		o := enumName(m.Outcome)
		p.Outcome = &o
	default:
		return nil, invalidf("outcome: unknown value %d", int32(m.Outcome))
	}
	rows, err := d.q.SearchRouteEvents(ctx, p)
	if err != nil {
		return nil, err
	}
	var next string
	if len(rows) > int(limit) {
		rows = rows[:limit]
		last := rows[len(rows)-1]
		next = pageToken(last.StartedAt, last.ID)
	}
	out, err := routeEventProtos(rows)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.SearchRouteEventsResponse{Events: out, NextPageToken: next}), nil
}

// pageToken is a keyset cursor: the last row's start time and id.
func pageToken(startedAt time.Time, id int64) string {
	return strconv.FormatInt(startedAt.UnixNano(), 10) + "." + strconv.FormatInt(id, 10)
}

func parsePageToken(tok string) (time.Time, int64, error) {
	a, b, ok := strings.Cut(tok, ".")
	ns, err1 := strconv.ParseInt(a, 10, 64)
	id, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}, 0, invalidf("page_token: not one this service gave")
	}
	return time.Unix(0, ns), id, nil
}

// maxFailedRange bounds FailedAttempts' range: it reads every attempt
// record of the range.
const maxFailedRange = 7 * 24 * time.Hour

func (d dashboardService) FailedAttempts(ctx context.Context, req *connect.Request[weirv1.FailedAttemptsRequest]) (*connect.Response[weirv1.FailedAttemptsResponse], error) {
	m := req.Msg
	until := d.now()
	if m.Until != nil {
		until = m.Until.AsTime()
	}
	since := until.Add(-time.Hour)
	if m.Since != nil {
		since = m.Since.AsTime()
	}
	switch {
	case !since.Before(until):
		return nil, invalidf("since: must come before until")
	case until.Sub(since) > maxFailedRange:
		return nil, invalidf("since: at most %v before until", maxFailedRange)
	}
	p := db.FailedAttemptsParams{Since: since, Until: until}
	if m.AccountId != "" {
		acct, err := d.findAccount(ctx, m.AccountId)
		if err != nil {
			return nil, err
		}
		id := acct.ID.String()
		p.AccountID = &id
	}
	rows, err := d.q.FailedAttempts(ctx, p)
	if err != nil {
		return nil, err
	}
	out := make([]*weirv1.FailedAttemptCount, 0, len(rows))
	for _, r := range rows {
		class := weirv1.OutcomeClass(weirv1.OutcomeClass_value[r.Class]) // an unknown name (a newer worker's) is unspecified
		out = append(out, &weirv1.FailedAttemptCount{AccountId: r.AccountID.String(), Status: r.Status, Class: class,
			ErrorType: r.ErrorType, Attempts: r.Attempts, Latest: timestamppb.New(r.Latest)})
	}
	return connect.NewResponse(&weirv1.FailedAttemptsResponse{Counts: out}), nil
}

func (d dashboardService) UsageHistory(ctx context.Context, req *connect.Request[weirv1.UsageHistoryRequest]) (*connect.Response[weirv1.UsageHistoryResponse], error) {
	rng, bucket, err := historyRange(req.Msg.Range)
	if err != nil {
		return nil, err
	}
	p := db.UsageHistoryParams{BucketSeconds: bucket.Seconds(), Since: d.now().Add(-rng)}
	if req.Msg.AccountId != "" {
		acct, err := d.findAccount(ctx, req.Msg.AccountId)
		if err != nil {
			return nil, err
		}
		p.AccountID = uuid.NullUUID{UUID: acct.ID, Valid: true}
	}
	rows, err := d.q.UsageHistory(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &weirv1.UsageHistoryResponse{Bucket: durationpb.New(bucket)}
	var cur *weirv1.UsageSeries
	for _, r := range rows {
		if cur == nil || cur.AccountId != r.AccountID.String() || cur.Window != r.WindowName {
			cur = &weirv1.UsageSeries{AccountId: r.AccountID.String(), Window: r.WindowName}
			out.Series = append(out.Series, cur)
		}
		cur.Points = append(cur.Points, &weirv1.UsagePoint{At: timestamppb.New(r.Bucket), Utilization: r.Utilization,
			ResetsAt: timestamppb.New(r.ResetsAt)})
	}
	return connect.NewResponse(out), nil
}

func (d dashboardService) RouteStats(ctx context.Context, req *connect.Request[weirv1.RouteStatsRequest]) (*connect.Response[weirv1.RouteStatsResponse], error) {
	rng, bucket, err := historyRange(req.Msg.Range)
	if err != nil {
		return nil, err
	}
	rows, err := d.q.RouteEventBuckets(ctx, db.RouteEventBucketsParams{BucketSeconds: bucket.Seconds(), Since: d.now().Add(-rng)})
	if err != nil {
		return nil, err
	}
	out := &weirv1.RouteStatsResponse{Bucket: durationpb.New(bucket)}
	for _, r := range rows {
		out.Buckets = append(out.Buckets, &weirv1.RouteBucket{Start: timestamppb.New(r.Bucket), Requests: r.Requests,
			HeldRequests: r.HeldRequests, Holds: r.Holds, Errors: r.Errors})
	}
	return connect.NewResponse(out), nil
}

// historyRange checks a history range and picks its bucket: the range in
// historyBuckets parts, rounded up to whole minutes (snapshots are two
// minutes apart, so a finer bucket would only show gaps).
func historyRange(d *durationpb.Duration) (rng, bucket time.Duration, err error) {
	if d == nil {
		return 0, 0, invalidf("range: required")
	}
	rng = d.AsDuration()
	if rng < minHistoryRange || rng > maxHistoryRange {
		return 0, 0, invalidf("range: %v is out of range; must be between %v and %v", rng, minHistoryRange, maxHistoryRange)
	}
	bucket = (rng/historyBuckets + time.Minute - 1).Truncate(time.Minute)
	return rng, max(bucket, 2*time.Minute), nil
}

func (d dashboardService) AccountHistory(ctx context.Context, req *connect.Request[weirv1.AccountHistoryRequest]) (*connect.Response[weirv1.AccountHistoryResponse], error) {
	m := req.Msg
	acct, err := d.findAccount(ctx, m.AccountId)
	if err != nil {
		return nil, err
	}
	limit, err := pageLimit("limit", m.Limit, 100, 1000)
	if err != nil {
		return nil, err
	}
	rows, err := d.q.ListAccountHistory(ctx, db.ListAccountHistoryParams{AccountID: acct.ID, MaxRows: limit})
	if err != nil {
		return nil, err
	}
	out := make([]*weirv1.AccountHistoryEntry, 0, len(rows))
	for _, r := range rows {
		e := &weirv1.AccountHistoryEntry{At: timestamppb.New(r.At), Kind: r.Kind, Reason: r.Reason, Until: timestamppb.New(r.Until)}
		var ev policy.Evidence
		if json.Unmarshal(r.Evidence, &ev) == nil { // evidence a newer release wrote may say less here
			e.Class, e.Status, e.ErrorType, e.Rung, e.Cause = ev.Class, ev.Status, ev.ErrorType, string(ev.Rung), ev.Cause
		}
		out = append(out, e)
	}
	return connect.NewResponse(&weirv1.AccountHistoryResponse{Entries: out}), nil
}
