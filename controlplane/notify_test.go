package controlplane

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/riverqueue/river"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
)

func (e *env) notifyClient() weirv1connect.NotifyServiceClient {
	e.t.Helper()
	hc := rpcclient.HTTPClient()
	e.t.Cleanup(hc.CloseIdleConnections)
	return weirv1connect.NewNotifyServiceClient(hc, e.ts.URL,
		connect.WithInterceptors(rpcclient.Token(e.cfg.AdminToken), rpcclient.Actor("tester")))
}

// createTarget creates a target through the RPC; its URL (and any secret
// given or generated) join the secrets no log may show.
func (e *env) createTarget(req *weirv1.CreateTargetRequest) *weirv1.CreateTargetResponse {
	e.t.Helper()
	e.secrets.add(req.Url)
	if req.Secret != "" {
		e.secrets.add(req.Secret)
	}
	resp, err := e.notifyClient().CreateTarget(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("CreateTarget %s: %v", req.Name, err)
	}
	if resp.Msg.Secret != "" {
		e.secrets.add(resp.Msg.Secret)
	}
	requireAbsent(e.t, "CreateTarget", resp.Msg.Target, req.Url)
	return resp.Msg
}

// withJobs is another replica over e's database running River, its failed
// deliveries retried after retry; it stops when the test ends.
func (e *env) withJobs(retry time.Duration) *env {
	e.t.Helper()
	cfg := e.cfg
	cfg.Registry, cfg.Logger, cfg.DisableJobs = nil, nil, false
	cfg.notifyRetry = func(int) time.Duration { return retry }
	r := newEnv(e.t, e.pool, cfg, e.clock)
	r.secrets = e.secrets
	return r
}

func (e *env) startJobs() {
	e.t.Helper()
	if err := e.srv.Start(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(e.t.Context()), 10*time.Second)
		defer cancel()
		e.srv.Stop(ctx) //nolint:errcheck // teardown
	})
}

// enqueue raises ev in a transaction of its own.
func (e *env) enqueue(ev notify.Event) notify.Enqueued {
	e.t.Helper()
	var out notify.Enqueued
	err := pgx.BeginFunc(e.t.Context(), e.pool, func(tx pgx.Tx) error {
		var err error
		out, err = e.srv.notifier.Enqueue(e.t.Context(), tx, ev)
		return err
	})
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return out
}

func (e *env) delivery(id int64) db.ListNotifyDeliveriesRow {
	e.t.Helper()
	rows, err := e.q.ListNotifyDeliveries(e.t.Context(), db.ListNotifyDeliveriesParams{DeliveryID: pgtype.Int8{Int64: id, Valid: true}, MaxRows: 1})
	if err != nil || len(rows) != 1 {
		e.t.Fatalf("delivery %d: %v (%d rows)", id, err, len(rows))
	}
	return rows[0]
}

// arrival is one request a receiver got; answer tells the receiver what
// status to answer (an interactive receiver waits for it).
type arrival struct {
	path   string
	header http.Header
	body   []byte
	answer chan int
}

// receiver is a webhook receiver: each request arrives on got. An
// interactive one answers what the test sends on the arrival's answer
// channel, meanwhile holding the request; the others answer 200 at once.
type receiver struct {
	*httptest.Server
	got chan arrival
}

func newReceiver(t *testing.T, interactive bool) *receiver {
	t.Helper()
	r := &receiver{got: make(chan arrival, 64)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		a := arrival{path: req.URL.Path, header: req.Header.Clone(), body: body, answer: make(chan int, 1)}
		if !interactive {
			a.answer <- http.StatusOK
		}
		r.got <- a
		select {
		case status := <-a.answer:
			w.WriteHeader(status)
			io.WriteString(w, http.StatusText(status)+"\n") //nolint:errcheck // the delivery reads it
		case <-req.Context().Done():
		}
	}))
	t.Cleanup(r.Close)
	return r
}

// next waits for the next request.
func (r *receiver) next(t *testing.T) arrival {
	t.Helper()
	select {
	case a := <-r.got:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery arrived within 30s")
	}
	return arrival{}
}

// TestNotifyDelivery: through a control plane running River, a webhook
// whose receiver fails twice is delivered on the third attempt, the
// earlier failures showing as last_error meanwhile; its body verifies
// with the target's secret and does not once tampered. A Slack target
// gets {"text": ...}. The same event raised again (and twice at once) is
// delivered once. No response, log, stored error or audit row shows the
// URL's secret parts or the signing secret.
func TestNotifyDelivery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.withJobs(20 * time.Millisecond)
	completed, cancel := r.srv.river.Subscribe(river.EventKindJobCompleted)
	defer cancel()
	hook, chat := newReceiver(t, true), newReceiver(t, false)
	hookURL := hook.URL + "/hooks/T0SECRETPATH?token=SECRETQUERY"
	chatURL := chat.URL + "/services/T000/B000/SLACKSECRET"
	for _, part := range []string{"T0SECRETPATH", "SECRETQUERY", "SLACKSECRET"} {
		e.secrets.add(part) // no log may show a part of a URL either
	}
	webhook := e.createTarget(&weirv1.CreateTargetRequest{Name: "hook", Kind: weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_WEBHOOK, Url: hookURL})
	secret := webhook.Secret
	if !strings.HasPrefix(secret, "whsec_") || webhook.Target.UrlHint != hook.URL || len(webhook.Target.Events) != 0 {
		t.Fatalf("created webhook: %v, secret of %d characters", webhook.Target, len(secret))
	}
	slack := e.createTarget(&weirv1.CreateTargetRequest{Name: "chat", Kind: weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_SLACK, Url: chatURL,
		Events: []string{notify.PoolExhausted, notify.PoolRestored}})
	if slack.Secret != "" {
		t.Errorf("a Slack target got a secret")
	}
	e.createTarget(&weirv1.CreateTargetRequest{Name: "elsewhere", Url: chat.URL + "/other", Events: []string{notify.AccountBroken},
		Secret: "given-secret-0123456789"})
	r.startJobs()

	ev := notify.Event{Kind: notify.PoolExhausted, DedupKey: "pool/anthropic:exhausted@1", Severity: notify.Critical,
		Text: "anthropic: no account can serve now (2 accounts: 1 paused, 1 cooling)", Fields: map[string]any{"provider": "anthropic", "serving": 0}}
	first := e.enqueue(ev)
	if first.Duplicate || len(first.Deliveries) != 2 {
		t.Fatalf("first Enqueue: %+v, want deliveries to hook and chat", first)
	}
	// The same event again, twice at once: nothing more.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if again := e.enqueue(ev); !again.Duplicate || len(again.Deliveries) != 0 {
				t.Errorf("the same event again: %+v", again)
			}
		})
	}
	wg.Wait()
	var hookID int64
	for _, id := range first.Deliveries {
		if e.delivery(id).TargetName == "hook" {
			hookID = id
		}
	}

	// The webhook: 500, 503, then 200.
	for attempt, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusOK} {
		a := hook.next(t)
		if err := notify.Verify(secret, a.header.Get(notify.SignatureHeader), a.body, e.clock.Now(), time.Minute); err != nil {
			t.Errorf("attempt %d: the signature does not verify with the target's secret: %v", attempt+1, err)
		}
		tampered := strings.Replace(string(a.body), `"serving":0`, `"serving":1`, 1)
		if tampered == string(a.body) || notify.Verify(secret, a.header.Get(notify.SignatureHeader), []byte(tampered), e.clock.Now(), time.Minute) == nil {
			t.Errorf("attempt %d: a tampered body verifies", attempt+1)
		}
		var p notify.Payload
		if err := json.Unmarshal(a.body, &p); err != nil || p.ID != first.EventID || p.Kind != notify.PoolExhausted || p.Text != ev.Text {
			t.Errorf("attempt %d: payload %s: %v", attempt+1, a.body, err)
		}
		d := e.delivery(hookID)
		wantErr := []string{"", "HTTP 500: Internal Server Error", "HTTP 503: Service Unavailable"}[attempt]
		if d.Status != "pending" || int(d.Attempts) != attempt || d.LastError != wantErr || d.DeliveredAt != nil {
			t.Errorf("during attempt %d: %s, %d attempts, last error %q; want pending, %d, %q",
				attempt+1, d.Status, d.Attempts, d.LastError, attempt, wantErr)
		}
		a.answer <- status
	}
	for done := 0; done < 2; {
		select {
		case ev := <-completed:
			if ev.Job.Kind == (notify.DeliveryArgs{}).Kind() {
				done++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the deliveries' jobs did not complete within 30s")
		}
	}
	d := e.delivery(hookID)
	if d.Status != "delivered" || d.Attempts != 3 || d.DeliveredAt == nil {
		t.Errorf("after the third attempt: %s, %d attempts, delivered at %v", d.Status, d.Attempts, d.DeliveredAt)
	}

	// Slack: one request, {"text": ...} only.
	a := chat.next(t)
	var text map[string]string
	if err := json.Unmarshal(a.body, &text); err != nil || len(text) != 1 ||
		!strings.HasPrefix(text["text"], ":red_circle: *weir pool_exhausted* anthropic: no account can serve now") ||
		!strings.Contains(text["text"], "\n> provider: anthropic") || a.path != "/services/T000/B000/SLACKSECRET" {
		t.Errorf("slack got %s at %s: %v", a.body, a.path, err)
	}
	select {
	case a := <-chat.got:
		t.Errorf("a second request reached the Slack receiver: %s", a.body)
	case a := <-hook.got:
		t.Errorf("a fourth request reached the webhook: %s", a.body)
	default:
	}
	if n := e.count(`SELECT count(*) FROM notify_events`); n != 1 {
		t.Errorf("%d events stored, want 1", n)
	}

	// What operators see shows no secret.
	nc := e.notifyClient()
	targets, err := nc.ListTargets(t.Context(), connect.NewRequest(&weirv1.ListTargetsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := nc.ListDeliveries(t.Context(), connect.NewRequest(&weirv1.ListDeliveriesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(targets.Msg.Targets) != 3 || len(deliveries.Msg.Deliveries) != 2 {
		t.Fatalf("%d targets, %d deliveries", len(targets.Msg.Targets), len(deliveries.Msg.Deliveries))
	}
	var jobErrors, audit string
	if err := e.pool.QueryRow(t.Context(), `SELECT coalesce(string_agg(errors::text, ' '), '') FROM river_job WHERE kind = 'notify_delivery'`).Scan(&jobErrors); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(jobErrors, "HTTP 500") {
		t.Errorf("River's job errors lack the failed attempts: %s", jobErrors)
	}
	if err := e.pool.QueryRow(t.Context(), `SELECT string_agg(summary::text, ' ') FROM audit_events WHERE procedure LIKE '%CreateTarget'`).Scan(&audit); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(audit, `"redacted": ["url"]`) || !strings.Contains(audit, `"redacted": ["secret", "url"]`) || !strings.Contains(audit, `"name": "chat"`) {
		t.Errorf("audit summaries: %s", audit)
	}
	for _, s := range e.secrets.all() {
		for what, m := range map[string]proto.Message{"ListTargets": targets.Msg, "ListDeliveries": deliveries.Msg} {
			requireAbsent(t, what, m, s)
		}
		for what, text := range map[string]string{"River's job errors": jobErrors, "the audit log": audit, "last_error": d.LastError} {
			if strings.Contains(text, s) {
				t.Errorf("%s show a secret (%d characters)", what, len(s))
			}
		}
	}
}

// TestNotifyTargetErrors: what CreateTarget refuses, without repeating the
// URL; delete and test by name; a test goes to its one target.
func TestNotifyTargetErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	nc := e.notifyClient()
	ctx := t.Context()
	secretURL := "https://hooks.example.com/services/T0/B0/SECRETPART"
	e.secrets.add(secretURL)
	for _, tc := range []struct {
		req  *weirv1.CreateTargetRequest
		want string
	}{
		{&weirv1.CreateTargetRequest{Name: "x", Url: "ftp://hooks.example.com/SECRETPART"}, "url: must be an http or https URL"},
		{&weirv1.CreateTargetRequest{Name: "bad name", Url: secretURL}, "name:"},
		{&weirv1.CreateTargetRequest{Name: "x", Url: secretURL, Events: []string{"pool_exhausted", "nope"}}, `unknown event kind "nope"`},
		{&weirv1.CreateTargetRequest{Name: "x", Url: secretURL, Secret: "short"}, "secret: at least 16"},
		{&weirv1.CreateTargetRequest{Name: "x", Kind: weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_SLACK, Url: secretURL, Secret: "0123456789abcdef0"}, "not signed"},
	} {
		_, err := nc.CreateTarget(ctx, connect.NewRequest(tc.req))
		ce := wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(ce.Message(), tc.want) || strings.Contains(ce.Message(), "SECRETPART") {
			t.Errorf("%v: %q, want %q and no URL", tc.req.Name, ce.Message(), tc.want)
		}
	}
	e.createTarget(&weirv1.CreateTargetRequest{Name: "ops", Url: secretURL, Events: []string{notify.AccountBroken}})
	_, err := nc.CreateTarget(ctx, connect.NewRequest(&weirv1.CreateTargetRequest{Name: "ops", Url: secretURL}))
	if ce := wantCode(t, err, connect.CodeAlreadyExists); strings.Contains(ce.Message(), "SECRETPART") {
		t.Errorf("a repeated name: %q", ce.Message())
	}
	// A test event reaches the target whatever it subscribes to.
	sent, err := nc.SendTest(ctx, connect.NewRequest(&weirv1.SendTestRequest{Id: "ops"}))
	if err != nil {
		t.Fatal(err)
	}
	if d := sent.Msg.Delivery; d.TargetName != "ops" || d.EventKind != notify.Test || d.Status != weirv1.NotifyDeliveryStatus_NOTIFY_DELIVERY_STATUS_PENDING {
		t.Errorf("test delivery %v", d)
	}
	if _, err := nc.SendTest(ctx, connect.NewRequest(&weirv1.SendTestRequest{Id: "ops"})); err != nil {
		t.Errorf("a second test: %v", err)
	}
	if n := e.count(`SELECT count(*) FROM notify_deliveries`); n != 2 {
		t.Errorf("%d deliveries after two tests, want 2 (each test is new)", n)
	}
	if _, err := nc.DeleteTarget(ctx, connect.NewRequest(&weirv1.DeleteTargetRequest{Id: "ops"})); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM notify_deliveries`); n != 0 {
		t.Errorf("%d deliveries left with their target gone", n)
	}
	// A delivery whose target is gone is done, not retried.
	if err := e.srv.DeliverNotification(ctx, sent.Msg.Delivery.Id, 1, false); err != nil {
		t.Errorf("delivering to a deleted target: %v", err)
	}
	_, err = nc.DeleteTarget(ctx, connect.NewRequest(&weirv1.DeleteTargetRequest{Id: "ops"}))
	wantCode(t, err, connect.CodeNotFound)
}

// TestNotifyWatch: a mixed pool (one account broken by rejected
// credentials, one paused, one rate-limited) is exhausted; the paused one
// resumed restores it (still low); the broken one resumed recovers the
// account and the pool. Two replicas run the watch at once, again and
// again: each transition is raised once, with one delivery.
func TestNotifyWatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.replica()
	e.createTarget(&weirv1.CreateTargetRequest{Name: "ops", Url: "https://hooks.example.com/services/SECRET"})
	_, keyHash := e.createKey("")
	broken, _ := e.createAccount(acct{label: "broken", maxConc: 3})
	var leases []*weirv1.Lease
	for range 3 {
		leases = append(leases, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}))
	}
	for _, l := range leases {
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401, ErrorType: "authentication_error"})
	}
	paused, _ := e.createAccount(acct{label: "paused"})
	e.pause(paused.Id)
	e.createAccount(acct{label: "limited"})
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429,
		Headers: map[string]string{"retry-after": "3600"}})

	watch := func() {
		t.Helper()
		for range 3 {
			var wg sync.WaitGroup
			for _, s := range []*Server{e.srv, r.srv} {
				wg.Go(func() {
					if err := s.WatchNotifications(t.Context()); err != nil {
						t.Errorf("watch: %v", err)
					}
				})
			}
			wg.Wait()
			e.advanceAlive(time.Second)
		}
	}
	raised := func() []string {
		t.Helper()
		rows, err := e.pool.Query(t.Context(), `SELECT e.kind, e.fields->>'level', e.fields->>'account_label', count(d.id)
			FROM notify_events e LEFT JOIN notify_deliveries d ON d.event_id = e.id GROUP BY e.id ORDER BY e.id`)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for rows.Next() {
			var kind string
			var level, label *string
			var n int
			if err := rows.Scan(&kind, &level, &label, &n); err != nil {
				t.Fatal(err)
			}
			s := kind
			for _, v := range []*string{level, label} {
				if v != nil {
					s += " " + *v
				}
			}
			if n != 1 {
				s += " (deliveries: " + string(rune('0'+n)) + ")"
			}
			out = append(out, s)
		}
		return out
	}
	want := func(step string, events ...string) {
		t.Helper()
		if got := raised(); strings.Join(got, "; ") != strings.Join(events, "; ") {
			t.Errorf("%s: raised\n  %s\nwant\n  %s", step, strings.Join(got, "; "), strings.Join(events, "; "))
		}
	}
	watch()
	want("exhausted", "account_broken broken", "pool_exhausted exhausted")
	e.resume(paused.Id)
	watch()
	want("one back", "account_broken broken", "pool_exhausted exhausted", "pool_restored low")
	e.resume(broken.Id)
	watch()
	want("all but the limited back", "account_broken broken", "pool_exhausted exhausted", "pool_restored low",
		"account_recovered broken", "pool_restored ok")
	var text string
	if err := e.pool.QueryRow(t.Context(), `SELECT text FROM notify_events WHERE kind = 'pool_exhausted'`).Scan(&text); err != nil {
		t.Fatal(err)
	}
	if text != "anthropic: no account can serve now (3 accounts: 1 paused, 1 broken, 1 cooling)" {
		t.Errorf("pool_exhausted text %q", text)
	}
}

// TestNotifyBreaker: a breaker open past breaker_notify_after is raised
// once; its closing after that too.
func TestNotifyBreaker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createAccount(acct{})
	if _, err := e.adminAPI(e.cfg.AdminToken, "tester").settings.UpdateSettings(t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings:   &weirv1.Settings{BreakerNotifyAfter: durationpb.New(2 * time.Minute)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"breaker_notify_after"}},
	})); err != nil {
		t.Fatal(err)
	}
	put := func(open bool) {
		t.Helper()
		p := db.PutBreakerParams{Provider: "anthropic", Family: "opus", Overloads: 4, WindowStart: e.clock.Now(),
			ProbeEveryMs: 2000, OpenCount: 1, Now: e.clock.Now(),
			SeenAccounts: orEmpty(nil), JudgedAccounts: orEmpty(nil), ProbedAccounts: orEmpty(nil)}
		if open {
			until := e.clock.Now().Add(2 * time.Second)
			p.OpenUntil = &until
		}
		if err := e.q.PutBreaker(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	kinds := func() string {
		t.Helper()
		var s string
		if err := e.pool.QueryRow(t.Context(), `SELECT coalesce(string_agg(kind, ' ' ORDER BY id), '') FROM notify_events`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	watch := func() {
		t.Helper()
		if err := e.srv.WatchNotifications(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	put(true)
	watch()
	e.advanceAlive(time.Minute)
	watch()
	if k := kinds(); k != "" {
		t.Fatalf("a breaker open a minute: raised %q", k)
	}
	e.advanceAlive(time.Minute)
	watch()
	watch()
	if k := kinds(); k != "breaker_open_long" {
		t.Fatalf("a breaker open two minutes: raised %q", k)
	}
	put(false)
	watch()
	watch()
	if k := kinds(); k != "breaker_open_long breaker_closed" {
		t.Fatalf("after it closed: raised %q", k)
	}
}
