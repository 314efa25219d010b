package e2e

import (
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
	"github.com/weirhq/weir/internal/syncbuf"
)

// TestSecretsNeverLeak runs a scenario through every kind of answer (a
// success, a stream, a 429 failed over, an account whose credential is
// rejected, a client's bad key, a bad body) and the operators' reads
// (accounts, route events, both servers' metrics), and scans everything it
// produced (every log line of the control plane and the worker at debug
// level, every response's headers and body, every span's attributes and
// events on both sides) for any credential: the
// accounts' keys and tokens, the client key, the admin and data-plane
// tokens. None may appear.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	exp, opts := tracing(t)
	e := setup(t, options{logs: logs, cpTracer: opts.cpTracer, dpTracer: opts.dpTracer, accounts: []account{
		{label: "limited", priority: 10, faults: []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: 30}}},
		{label: "rejected", priority: 5, faults: []sim.Fault{{Kind: sim.FaultRevoked}}},
		{label: "max", oauth: true},
	}})
	var seen strings.Builder
	keep := func(r response) {
		for k, vs := range r.header {
			seen.WriteString(k + ": " + strings.Join(vs, ", ") + "\n")
		}
		seen.Write(r.body)
		seen.WriteString("\n")
	}

	ok := e.do(http.MethodPost, "/v1/messages", messagesBody(false), nil)
	if ok.status != http.StatusOK {
		t.Fatalf("the scenario's request: %d %s", ok.status, ok.body)
	}
	keep(ok)
	keep(e.do(http.MethodPost, "/v1/messages", messagesBody(true), nil))
	keep(e.do(http.MethodPost, "/v1/messages", messagesBody(false), func(r *http.Request) {
		r.Header.Set("X-Api-Key", e.key+"-wrong")
	}))
	keep(e.do(http.MethodPost, "/v1/messages", `{"model":`, nil))
	keep(e.do(http.MethodGet, "/v1/models", "", nil))
	keep(e.doWith(e.client, e.dpSrv.URL, http.MethodGet, "/metrics", "", nil))
	keep(e.doWith(http.DefaultClient, e.cpSrv.URL, http.MethodGet, "/metrics", "", nil))
	e.routeEvent(ok.header.Get("Weir-Request-Id"))

	ctx := t.Context()
	accounts, err := e.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	seen.WriteString(accounts.Msg.String())
	events, err := e.routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 100}))
	if err != nil {
		t.Fatal(err)
	}
	seen.WriteString(events.Msg.String())
	// The scenario met the faults it is about: a 429 failed over and a
	// rejected credential (both name the account and its answer in logs).
	if a := strings.Join(e.attempts(), " "); !strings.Contains(a, "limited:") || !strings.Contains(a, "rejected:") {
		t.Errorf("simulator attempts %q: the faulty accounts were not tried", a)
	}

	secrets := map[string]string{"client key": e.key, "admin token": e.admin, "data-plane token": e.dpToken}
	for label, cred := range e.creds {
		secrets["credential of "+label] = cred
	}
	// Every span's name, attributes, events and status, of both servers.
	var spans strings.Builder
	for _, sp := range exp.GetSpans() {
		spans.WriteString(sp.Name + " " + sp.Status.Description + "\n")
		for _, kv := range sp.Attributes {
			spans.WriteString(string(kv.Key) + "=" + kv.Value.String() + "\n")
		}
		for _, ev := range sp.Events {
			spans.WriteString(ev.Name + "\n")
			for _, kv := range ev.Attributes {
				spans.WriteString(string(kv.Key) + "=" + kv.Value.String() + "\n")
			}
		}
	}
	if spans.Len() == 0 {
		t.Fatal("no spans were recorded: the scan of trace attributes would prove nothing")
	}
	everything := logs.String() + "\n" + seen.String() + "\n" + spans.String()
	if len(logs.String()) == 0 {
		t.Fatal("the servers logged nothing: the scan would prove nothing")
	}
	for name, secret := range secrets {
		if secret == "" {
			t.Fatalf("%s is empty", name)
		}
		// A secret cut short is still a leak: its first 16 bytes are enough
		// to find it (every one is longer and random past its prefix).
		for _, probe := range []string{secret, secret[len(secret)/2:]} {
			if strings.Contains(everything, probe) {
				t.Errorf("the %s appears in what the scenario produced", name)
				break
			}
		}
	}
	t.Logf("scanned %d bytes of logs, %d of answers and %d of %d spans for %d secrets",
		len(logs.String()), seen.Len(), spans.Len(), len(exp.GetSpans()), len(secrets))
}
