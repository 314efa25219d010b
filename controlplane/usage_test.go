package controlplane

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/sim"
)

func tm(t time.Time) *time.Time { return &t }

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func TestUsageCadence(t *testing.T) {
	t.Parallel()
	now := epoch
	for _, tc := range []struct {
		name     string
		lastUsed *time.Time
		jitter   float64
		want     time.Duration
	}{
		{"never used is idle", nil, 0, 10 * time.Minute},
		{"used just now is busy", tm(now), 0, 90 * time.Second},
		{"used 9m59s ago is busy", tm(now.Add(-10*time.Minute + time.Second)), 0, 90 * time.Second},
		{"used 10m ago is idle", tm(now.Add(-10 * time.Minute)), 0, 10 * time.Minute},
		{"busy, jitter -1", tm(now), -1, 76500 * time.Millisecond},
		{"busy, jitter +1", tm(now), 1, 103500 * time.Millisecond},
		{"idle, jitter -1", nil, -1, 510 * time.Second},
		{"idle, jitter +1", nil, 1, 690 * time.Second},
		{"jitter beyond 1 is clamped", nil, 7, 690 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := usageCadence(tc.lastUsed, now, tc.jitter).Sub(now); got != tc.want {
				t.Errorf("next read in %v, want %v", got, tc.want)
			}
		})
	}
}

func TestUsageBackoff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		failures   int32
		retryAfter time.Duration
		want       time.Duration
	}{
		{1, 0, time.Minute},
		{2, 0, 2 * time.Minute},
		{3, 0, 4 * time.Minute},
		{5, 0, 16 * time.Minute},
		{6, 0, 30 * time.Minute},
		{60, 0, 30 * time.Minute},
		{1, 450 * time.Second, 450 * time.Second},
		{4, 10 * time.Second, 10 * time.Second},
		{1, 2 * time.Hour, 30 * time.Minute},
	} {
		if got := usageBackoff(tc.failures, tc.retryAfter); got != tc.want {
			t.Errorf("usageBackoff(%d, %v) = %v, want %v", tc.failures, tc.retryAfter, got, tc.want)
		}
	}
}

// usageEnv is a control plane with OAuth accounts that live in a simulator
// sharing its clock, over real HTTP.
type usageEnv struct {
	*env
	sim    *sim.Server
	simURL string
	// hook, when set, runs inside every usage request before it reaches
	// the simulator: a test's way to change things while a read is in
	// flight.
	hook func(*http.Request)
}

// hookTransport runs the env's hook, then sends the request.
type hookTransport struct{ u *usageEnv }

func (h hookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.u.hook != nil {
		h.u.hook(r)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// setupUsage starts a simulator with accounts (oauth, with live windows)
// and a control plane whose accounts of the same labels point at it.
func setupUsage(t *testing.T, accounts ...sim.AccountScript) (*usageEnv, map[string]*weirv1.Account) {
	t.Helper()
	pool := pgtest.NewPool(t)
	clock := newClock()
	u := &usageEnv{}
	cfg := testConfig(clock)
	cfg.UsageClient = &http.Client{Transport: hookTransport{u}, Timeout: 10 * time.Second}
	u.env = newEnv(t, pool, cfg, clock)
	// Unknown credentials are served too, as accounts without windows: a
	// test may give an account a new credential.
	u.sim = sim.New(sim.Config{Now: clock.Now, Script: sim.Script{Accounts: accounts, AcceptUnknown: true}})
	ts := httptest.NewServer(u.sim)
	t.Cleanup(ts.Close)
	u.simURL = ts.URL
	out := map[string]*weirv1.Account{}
	for _, a := range accounts {
		kind := weirv1.AuthKind_AUTH_KIND_OAUTH
		if a.Kind == sim.KindAPIKey {
			kind = weirv1.AuthKind_AUTH_KIND_API_KEY
		}
		out[a.Name], _ = u.createAccount(acct{label: a.Name, credential: a.Credential, kind: kind, baseURL: ts.URL})
	}
	return u, out
}

// maxAccount is an OAuth account at 45% of its five-hour window (resetting
// in 3h) and 10% of its week (in 100h), with no family windows.
func maxAccount(name string) sim.AccountScript {
	return sim.AccountScript{
		Name: name, Kind: sim.KindOAuth, Credential: oauthToken(),
		Windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 450, ResetIn: sim.Duration(3 * time.Hour)},
			SevenDay: &sim.Window{Limit: 10000, Used: 1000, ResetIn: sim.Duration(100 * time.Hour)},
		},
	}
}

// usageReads is how many requests reached the simulator's usage endpoint.
func (u *usageEnv) usageReads() int {
	n := 0
	for _, a := range u.sim.Attempts() {
		if a.Path == upstream.AnthropicUsagePath {
			n++
		}
	}
	return n
}

func (u *usageEnv) refresh(ref string) *weirv1.RefreshUsageResponse {
	u.t.Helper()
	resp, err := u.admin.accounts.RefreshUsage(u.t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: ref}))
	if err != nil {
		u.t.Fatalf("RefreshUsage %s: %v", ref, err)
	}
	return resp.Msg
}

func (u *usageEnv) poll(id string) db.UsagePoll {
	u.t.Helper()
	p, err := u.q.GetUsagePoll(u.t.Context(), uuid.MustParse(id))
	if err != nil {
		u.t.Fatalf("read usage poll: %v", err)
	}
	return p
}

func window(a *weirv1.Account, name string) *weirv1.UsageWindow {
	for _, w := range a.Usage {
		if w.Window == name {
			return w
		}
	}
	return nil
}

func TestRefreshUsageStoresTheView(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, maxAccount("max"))
	id := accts["max"].Id
	if a := u.getAccount(id); len(a.Usage) != 0 || a.UsageReadAt != nil {
		t.Fatalf("a new account has usage %v read at %v; want none", a.Usage, a.UsageReadAt)
	}

	r := u.refresh("max")
	if !r.Read || r.Error != "" {
		t.Fatalf("RefreshUsage: read %v error %q", r.Read, r.Error)
	}
	if got, want := r.NextReadAllowedAt.AsTime(), epoch.Add(150*time.Second); !got.Equal(want) {
		t.Errorf("next read allowed at %v, want %v", got, want)
	}
	for _, a := range []*weirv1.Account{r.Account, u.getAccount(id), listAccount(t, u.env, id)} {
		if !a.GetUsageReadAt().AsTime().Equal(epoch) {
			t.Errorf("usage_read_at %v, want %v", a.GetUsageReadAt(), epoch)
		}
		if len(a.Usage) != 2 {
			t.Fatalf("usage %v: want five_hour and seven_day only (the others are null upstream)", a.Usage)
		}
		fh, sd := window(a, windowFiveHour), window(a, windowSevenDay)
		if fh == nil || fh.Utilization == nil || *fh.Utilization != 0.45 || !fh.ResetsAt.AsTime().Equal(epoch.Add(3*time.Hour)) ||
			fh.Source != sourcePoll || !fh.ObservedAt.AsTime().Equal(epoch) {
			t.Errorf("five_hour %v", fh)
		}
		if sd == nil || sd.Utilization == nil || *sd.Utilization != 0.1 || !sd.ResetsAt.AsTime().Equal(epoch.Add(100*time.Hour)) {
			t.Errorf("seven_day %v", sd)
		}
	}
	if n := u.usageReads(); n != 1 {
		t.Errorf("%d upstream reads, want 1", n)
	}
	// The simulator saw the bearer and the beta (it answers 401 without).
	if p := u.poll(id); p.Failures != 0 || p.LastError != nil {
		t.Errorf("poll state after a good read: %+v", p)
	}
}

func listAccount(t *testing.T, e *env, id string) *weirv1.Account {
	t.Helper()
	resp, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatalf("ListAccounts: %v", err)
	}
	for _, a := range resp.Msg.Accounts {
		if a.Id == id {
			return a
		}
	}
	t.Fatalf("ListAccounts: %s missing", id)
	return nil
}

func TestRefreshUsageOnlyForOAuth(t *testing.T) {
	t.Parallel()
	u, _ := setupUsage(t, sim.AccountScript{Name: "team", Kind: sim.KindAPIKey, Credential: apiKey()})
	_, err := u.admin.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: "team"}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = u.admin.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: "nobody"}))
	wantCode(t, err, connect.CodeNotFound)
	// Operators only: the data-plane token does not open AccountService.
	_, err = u.dp.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: "team"}))
	wantCode(t, err, connect.CodeUnauthenticated)
	if n := u.usageReads(); n != 0 {
		t.Errorf("%d upstream reads, want none", n)
	}
}

// Ten readers on two replicas at once, through the poller's path and the
// operator's: one read reaches the upstream.
func TestUsageBudgetHoldsAcrossReplicasAndCallers(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, maxAccount("max"))
	id := uuid.MustParse(accts["max"].Id)
	other := u.replica()
	servers := []*Server{u.srv, other.srv}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		reads   int
		refused []time.Time
	)
	for i := range 10 {
		wg.Go(func() {
			s := servers[i%2]
			var res usageResult
			var err error
			if i%3 == 0 {
				// The operator's way in.
				var resp *connect.Response[weirv1.RefreshUsageResponse]
				c := u.admin
				if i%2 == 1 {
					c = other.admin
				}
				resp, err = c.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: id.String()}))
				if err == nil {
					res = usageResult{read: resp.Msg.Read, nextAllowed: resp.Msg.NextReadAllowedAt.AsTime()}
				}
			} else {
				res, err = s.acct.readUsage(t.Context(), id)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("reader %d: %v", i, err)
				return
			}
			if res.read {
				reads++
			} else {
				refused = append(refused, res.nextAllowed)
			}
		})
	}
	wg.Wait()
	if reads != 1 || len(refused) != 9 {
		t.Fatalf("%d reads and %d refusals, want 1 and 9", reads, len(refused))
	}
	if n := u.usageReads(); n != 1 {
		t.Fatalf("the simulator saw %d usage reads, want exactly 1", n)
	}
	for _, at := range refused {
		if !at.Equal(epoch.Add(150 * time.Second)) {
			t.Errorf("a refusal said the next read is allowed at %v, want %v", at, epoch.Add(150*time.Second))
		}
	}

	// 149 s later: still refused, by either replica and the poller.
	u.clock.Advance(149 * time.Second)
	if r := u.refresh("max"); r.Read {
		t.Fatal("a read 149 s after the last one was allowed")
	}
	if _, err := u.q.RearmUsagePoll(t.Context(), db.RearmUsagePollParams{AccountID: id, NextReadAt: u.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if n, err := other.srv.acct.ReadDue(t.Context()); err != nil || n != 0 {
		t.Fatalf("ReadDue at 149 s: %d reads, %v; want none", n, err)
	}
	u.clock.Advance(time.Second)
	if r := u.refresh("max"); !r.Read {
		t.Fatalf("a read 150 s after the last one was refused (next at %v)", r.NextReadAllowedAt.AsTime())
	}
	if n := u.usageReads(); n != 2 {
		t.Fatalf("the simulator saw %d usage reads, want 2", n)
	}
}

// A restarted control plane (a new Server over the same database) neither
// reads early nor starts without the last readings.
func TestUsageSurvivesRestart(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, maxAccount("max"))
	id := accts["max"].Id
	if n, err := u.srv.acct.ReadDue(t.Context()); err != nil || n != 1 {
		t.Fatalf("first poll: %d reads, %v; want 1", n, err)
	}

	u.clock.Advance(100 * time.Second)
	cfg := u.cfg
	cfg.Registry, cfg.Logger = nil, nil
	restarted := newEnv(t, u.pool, cfg, u.clock)
	restarted.secrets = u.secrets
	a := restarted.getAccount(id)
	if fh := window(a, windowFiveHour); fh == nil || *fh.Utilization != 0.45 || !a.UsageReadAt.AsTime().Equal(epoch) {
		t.Fatalf("after a restart the view is cold: %v read at %v", a.Usage, a.UsageReadAt)
	}
	if n, err := restarted.srv.acct.ReadDue(t.Context()); err != nil || n != 0 {
		t.Fatalf("poll after restart: %d reads, %v; want none", n, err)
	}
	resp, err := restarted.admin.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: id}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.Read || !resp.Msg.NextReadAllowedAt.AsTime().Equal(epoch.Add(150*time.Second)) {
		t.Fatalf("after restart: read %v, next at %v; want refused until %v", resp.Msg.Read, resp.Msg.NextReadAllowedAt.AsTime(), epoch.Add(150*time.Second))
	}
	if n := u.usageReads(); n != 1 {
		t.Fatalf("the simulator saw %d reads, want 1", n)
	}
	// The persisted schedule holds too: the idle account is next read about
	// 10 minutes after the first read, not at boot.
	next := *u.poll(id).NextReadAt
	if next.Before(epoch.Add(510*time.Second)) || next.After(epoch.Add(690*time.Second)) {
		t.Errorf("next read at %v, want 10 min ± 15%% after %v", next, epoch)
	}
}

// The simulator allows one usage read per 10 minutes here: the second read
// draws a 429 with retry-after, and weir waits exactly that long.
func TestUsageRetryAfter(t *testing.T) {
	t.Parallel()
	acct := maxAccount("max")
	acct.UsageReadsPer10m = 1
	u, accts := setupUsage(t, acct)
	id := accts["max"].Id
	if r := u.refresh("max"); !r.Read || r.Error != "" {
		t.Fatalf("first read: %v %q", r.Read, r.Error)
	}

	u.clock.Advance(150 * time.Second)
	r := u.refresh("max")
	if !r.Read || !strings.Contains(r.Error, "429") {
		t.Fatalf("second read: read %v error %q; want a 429", r.Read, r.Error)
	}
	blocked := epoch.Add(10 * time.Minute) // the simulator's retry-after: 450 s
	if !r.NextReadAllowedAt.AsTime().Equal(blocked) {
		t.Errorf("next read allowed at %v, want %v", r.NextReadAllowedAt.AsTime(), blocked)
	}
	p := u.poll(id)
	if p.Failures != 1 || p.BlockedUntil == nil || !p.BlockedUntil.Equal(blocked) || p.LastError == nil || !p.NextReadAt.Equal(blocked) {
		t.Fatalf("poll state after a 429: %+v", p)
	}
	if strings.Contains(*p.LastError, acct.Credential) {
		t.Fatal("last_error holds the credential")
	}
	// The reading from before the 429 is still the view.
	if a := u.getAccount(id); window(a, windowFiveHour) == nil {
		t.Fatal("a failed read wiped the view")
	}

	u.clock.Advance(blocked.Sub(u.clock.Now()) - time.Second)
	if r := u.refresh("max"); r.Read {
		t.Fatal("read before the retry-after passed")
	}
	if n, err := u.srv.acct.ReadDue(t.Context()); err != nil || n != 0 {
		t.Fatalf("poller before the retry-after: %d, %v", n, err)
	}
	if n := u.usageReads(); n != 2 {
		t.Fatalf("%d upstream reads, want 2", n)
	}
	u.clock.Advance(time.Second)
	if n, err := u.srv.acct.ReadDue(t.Context()); err != nil || n != 1 {
		t.Fatalf("poller at the retry-after: %d reads, %v; want 1", n, err)
	}
	if p := u.poll(id); p.Failures != 0 || p.BlockedUntil != nil || p.LastError != nil {
		t.Fatalf("poll state after recovering: %+v", p)
	}
	for _, a := range u.sim.Attempts() {
		if a.Path == upstream.AnthropicUsagePath && a.Status == http.StatusTooManyRequests && a.Time.Before(epoch.Add(150*time.Second)) {
			t.Error("a 429 came before the budget allowed a second read")
		}
	}
}

// Without an answer (the upstream is down), reads back off 1 min, 2, 4, …
// on top of the 150 s budget, and the error says why without the token.
func TestUsageTransportBackoff(t *testing.T) {
	t.Parallel()
	u, _ := setupUsage(t)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	a, token := u.createAccount(acct{label: "gone", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken(), baseURL: down.URL})
	id := a.Id

	r := u.refresh("gone")
	if !r.Read || !strings.Contains(r.Error, "unreachable") || strings.Contains(r.Error, token) {
		t.Fatalf("read of a dead upstream: read %v error %q", r.Read, r.Error)
	}
	// 1 min of backoff is inside the 150 s budget.
	if want := epoch.Add(150 * time.Second); !r.NextReadAllowedAt.AsTime().Equal(want) {
		t.Errorf("next read at %v, want %v", r.NextReadAllowedAt.AsTime(), want)
	}
	for i, backoff := range []time.Duration{2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 16 * time.Minute, 30 * time.Minute, 30 * time.Minute} {
		u.clock.Advance(r.NextReadAllowedAt.AsTime().Sub(u.clock.Now()))
		now := u.clock.Now()
		r = u.refresh("gone")
		if !r.Read || r.Error == "" {
			t.Fatalf("failure %d: read %v error %q", i+2, r.Read, r.Error)
		}
		want := now.Add(max(backoff, 150*time.Second))
		if !r.NextReadAllowedAt.AsTime().Equal(want) {
			t.Errorf("failure %d: next read at %v, want %v (backoff %v)", i+2, r.NextReadAllowedAt.AsTime(), want, backoff)
		}
		if p := u.poll(id); p.Failures != int32(i+2) || strings.Contains(*p.LastError, token) {
			t.Errorf("failure %d: poll state %+v", i+2, p)
		}
	}
}

// A read claimed under one epoch never lands once the epoch has moved on:
// a quota cooldown re-armed polling, or the credential was replaced, while
// the read was in flight.
func TestUsageEpochFencing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		bump func(u *usageEnv, id string)
	}{
		{"re-armed", func(u *usageEnv, id string) {
			if _, err := rearmUsage(u.t.Context(), u.q, uuid.MustParse(id), u.clock.Now().Add(time.Hour)); err != nil {
				u.t.Errorf("rearm: %v", err)
			}
		}},
		{"credential replaced", func(u *usageEnv, id string) {
			cred := oauthToken()
			u.secrets.add(cred)
			if _, err := u.admin.accounts.UpdateAccount(u.t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
				Id: id, Credential: cred, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
			})); err != nil {
				u.t.Errorf("update credential: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, accts := setupUsage(t, maxAccount("max"))
			id := accts["max"].Id
			before := u.poll(id).Epoch
			var once sync.Once
			u.hook = func(*http.Request) { once.Do(func() { tc.bump(u, id) }) }

			res, err := u.srv.acct.readUsage(t.Context(), uuid.MustParse(id))
			if err != nil {
				t.Fatal(err)
			}
			if !res.read || res.landed || res.failure != nil {
				t.Fatalf("read %v landed %v failure %v; want a read that does not land", res.read, res.landed, res.failure)
			}
			if n := u.usageReads(); n != 1 {
				t.Fatalf("%d upstream reads, want 1", n)
			}
			a := u.getAccount(id)
			if len(a.Usage) != 0 || a.UsageReadAt != nil {
				t.Fatalf("a reading of an old epoch landed: %v read at %v", a.Usage, a.UsageReadAt)
			}
			p := u.poll(id)
			if p.Epoch != before+1 {
				t.Errorf("epoch %d, want %d", p.Epoch, before+1)
			}
			// The budget still counts the read that did not land.
			u.hook = nil
			if r := u.refresh(id); r.Read {
				t.Fatal("the budget forgot the read that did not land")
			}
			u.clock.Advance(150 * time.Second)
			if r := u.refresh(id); !r.Read || window(r.Account, windowFiveHour) == nil {
				t.Fatalf("a read under the new epoch: read %v, usage %v", r.Read, r.Account.GetUsage())
			}
		})
	}
}

func TestCredentialUpdateBumpsTheEpoch(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, maxAccount("max"))
	id := accts["max"].Id
	if n, err := u.srv.acct.ReadDue(t.Context()); err != nil || n != 1 {
		t.Fatalf("poll: %d, %v", n, err)
	}
	p := u.poll(id)
	if p.NextReadAt == nil {
		t.Fatal("no next read scheduled after a read")
	}
	cred := oauthToken()
	u.secrets.add(cred)
	if _, err := u.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: id, Credential: cred, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
	})); err != nil {
		t.Fatal(err)
	}
	q := u.poll(id)
	if q.Epoch != p.Epoch+1 || q.CredentialRevision != 2 || q.NextReadAt != nil {
		t.Fatalf("after a credential update: epoch %d (was %d), revision %d, next read %v; want a new epoch, revision 2, unscheduled",
			q.Epoch, p.Epoch, q.CredentialRevision, q.NextReadAt)
	}
	// Other updates leave the epoch alone.
	if _, err := u.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: id, Priority: 3, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"priority"}},
	})); err != nil {
		t.Fatal(err)
	}
	if r := u.poll(id); r.Epoch != q.Epoch {
		t.Fatalf("a priority change moved the epoch to %d", r.Epoch)
	}
	// The readings of the old credential stay visible until the new one is
	// read (a refreshed token is the same subscription).
	if a := u.getAccount(id); window(a, windowFiveHour) == nil {
		t.Fatal("the view was wiped by a credential update")
	}
}

// The poller: at boot, unscheduled accounts get first reads spread over
// 90 s; after a read, a busy account is read again within the budget (150
// s), an idle one about 10 minutes later.
func TestReadDueCadence(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, maxAccount("a"), maxAccount("b"), maxAccount("c"))
	u.srv.acct.jitter = func() float64 { return 0 }
	busy := accts["b"].Id
	if _, err := u.pool.Exec(t.Context(), `UPDATE accounts SET last_used_at = $1 WHERE id = $2`, epoch, uuid.MustParse(busy)); err != nil {
		t.Fatal(err)
	}
	// API-key accounts are never scheduled.
	u.createAccount(acct{label: "team"})

	n, err := u.srv.acct.ReadDue(t.Context())
	if err != nil || n != 1 {
		t.Fatalf("boot poll: %d reads, %v; want the first of three", n, err)
	}
	var scheduled []time.Time
	for _, label := range []string{"a", "b", "c"} {
		p := u.poll(accts[label].Id)
		if p.NextReadAt == nil {
			t.Fatalf("%s unscheduled after the boot poll", label)
		}
		if p.LastReadAt == nil {
			scheduled = append(scheduled, *p.NextReadAt)
		}
	}
	if len(scheduled) != 2 {
		t.Fatalf("%d accounts waiting for their first read, want 2", len(scheduled))
	}
	for _, at := range scheduled {
		if off := at.Sub(epoch); off != 30*time.Second && off != 60*time.Second {
			t.Errorf("first read staggered to +%v, want +30s or +60s", off)
		}
	}
	if n := u.count(`SELECT count(*) FROM usage_polls p JOIN accounts a ON a.id = p.account_id WHERE a.auth_kind = 'api_key' AND p.next_read_at IS NOT NULL`); n != 0 {
		t.Errorf("%d API-key accounts scheduled", n)
	}

	u.clock.Advance(60 * time.Second)
	if n, err := u.srv.acct.ReadDue(t.Context()); err != nil || n != 2 {
		t.Fatalf("poll at +60s: %d reads, %v; want 2", n, err)
	}
	// Whichever was read when, each next read follows from its last: the
	// busy account's 90 s is held to the 150 s budget, the idle ones wait
	// 10 minutes (no jitter here).
	for _, label := range []string{"a", "b", "c"} {
		p := u.poll(accts[label].Id)
		every := 10 * time.Minute
		if accts[label].Id == busy {
			every = 150 * time.Second
		}
		if want := p.LastReadAt.Add(every); !p.NextReadAt.Equal(want) {
			t.Errorf("%s: last read %v, next %v; want %v", label, p.LastReadAt, p.NextReadAt, want)
		}
	}
	if n := u.usageReads(); n != 3 {
		t.Fatalf("%d upstream reads, want 3", n)
	}
}

// Each case seeds a window (or not), merges a response's headers, and says
// what is stored after.
func TestMergeUsageHeaders(t *testing.T) {
	t.Parallel()
	u, _ := setupUsage(t)
	now := epoch
	reset := now.Add(3 * time.Hour)
	at := func(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
	fiveHour := func(status, util string, reset time.Time) map[string]string {
		return map[string]string{
			"anthropic-ratelimit-unified-5h-status":      status,
			"anthropic-ratelimit-unified-5h-utilization": util,
			"anthropic-ratelimit-unified-5h-reset":       at(reset),
		}
	}
	type stored struct {
		util   float64
		reset  time.Time
		source string
	}
	for _, tc := range []struct {
		name    string
		apiKey  bool
		seed    *stored
		headers map[string]string
		// staleRevision sends the headers under the revision before the
		// current credential's.
		staleRevision bool
		want          *stored
	}{
		{name: "allowed lands", headers: fiveHour("allowed", "0.45", reset), want: &stored{0.45, reset, sourceHeader}},
		{name: "allowed_warning lands", headers: fiveHour("allowed_warning", "0.91", reset), want: &stored{0.91, reset, sourceHeader}},
		{name: "rejected is not a reading", headers: fiveHour("rejected", "1.0", reset)},
		{name: "utilization out of range", headers: fiveHour("allowed", "1.5", reset)},
		{name: "reset in the past", headers: fiveHour("allowed", "0.3", now.Add(-time.Minute))},
		{
			name: "same window: the higher wins (header above the poll)",
			seed: &stored{0.5, reset, sourcePoll}, headers: fiveHour("allowed", "0.6", reset.Add(time.Second)),
			want: &stored{0.6, reset.Add(time.Second), sourceHeader},
		},
		{
			name: "same window: the poll's 100 outlives the header's saturated 0.99",
			seed: &stored{1, reset, sourcePoll}, headers: fiveHour("allowed_warning", "0.99", reset.Add(-2*time.Second)),
			want: &stored{1, reset, sourcePoll},
		},
		{
			name: "a new window replaces a fuller old one",
			seed: &stored{0.9, reset, sourcePoll}, headers: fiveHour("allowed", "0.02", reset.Add(5*time.Hour)),
			want: &stored{0.02, reset.Add(5 * time.Hour), sourceHeader},
		},
		{
			name: "a rejected header leaves the stored reading alone",
			seed: &stored{0.5, reset, sourcePoll}, headers: fiveHour("rejected", "1.0", reset),
			want: &stored{0.5, reset, sourcePoll},
		},
		{
			name: "an older credential revision is ignored",
			seed: &stored{0.2, reset, sourcePoll}, headers: fiveHour("allowed", "0.8", reset), staleRevision: true,
			want: &stored{0.2, reset, sourcePoll},
		},
		{name: "API-key accounts have no usage windows", apiKey: true, headers: fiveHour("allowed", "0.45", reset)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kind, cred := weirv1.AuthKind_AUTH_KIND_OAUTH, oauthToken()
			if tc.apiKey {
				kind, cred = weirv1.AuthKind_AUTH_KIND_API_KEY, apiKey()
			}
			a, _ := u.createAccount(acct{kind: kind, credential: cred})
			id := uuid.MustParse(a.Id)
			rev := a.CredentialRevision
			if tc.staleRevision {
				next := oauthToken()
				u.secrets.add(next)
				if _, err := u.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
					Id: a.Id, Credential: next, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
				})); err != nil {
					t.Fatal(err)
				}
			}
			if tc.seed != nil {
				cur := u.accountRow(a.Id).CredentialRevision
				if _, err := u.q.UpsertUsageWindow(t.Context(), db.UpsertUsageWindowParams{
					AccountID: id, WindowName: windowFiveHour, Utilization: &tc.seed.util, ResetsAt: &tc.seed.reset,
					Source: tc.seed.source, Now: now.Add(-time.Minute), CredentialRevision: cur,
				}); err != nil {
					t.Fatal(err)
				}
			}
			if err := u.srv.acct.mergeUsageHeaders(t.Context(), u.q, []answeredUsage{{account: id, revision: rev, headers: tc.headers}}, now); err != nil {
				t.Fatal(err)
			}
			w := window(u.getAccount(a.Id), windowFiveHour)
			switch {
			case tc.want == nil && w != nil:
				t.Fatalf("a reading landed: %v", w)
			case tc.want == nil:
			case w == nil:
				t.Fatalf("no reading, want %v", tc.want)
			case *w.Utilization != tc.want.util || !w.ResetsAt.AsTime().Equal(tc.want.reset) || w.Source != tc.want.source:
				t.Fatalf("stored %v %v %s, want %v %v %s", *w.Utilization, w.ResetsAt.AsTime(), w.Source, tc.want.util, tc.want.reset, tc.want.source)
			}
		})
	}
}

// Release merges the headers of the outcome it reports, under the lease's
// credential revision.
func TestReleaseMergesUsageHeaders(t *testing.T) {
	t.Parallel()
	u, _ := setupUsage(t)
	_, key := u.createKey("")
	a, _ := u.createAccount(acct{label: "max", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})
	reset := strconv.FormatInt(epoch.Add(2*time.Hour).Unix(), 10)
	headers := map[string]string{
		"anthropic-ratelimit-unified-status":         "allowed",
		"anthropic-ratelimit-unified-5h-status":      "allowed",
		"anthropic-ratelimit-unified-5h-utilization": "0.37",
		"anthropic-ratelimit-unified-5h-reset":       reset,
		"anthropic-ratelimit-unified-7d-status":      "allowed",
		"anthropic-ratelimit-unified-7d-utilization": "0.12",
		"anthropic-ratelimit-unified-7d-reset":       strconv.FormatInt(epoch.Add(90*time.Hour).Unix(), 10),
	}
	l := u.mustLease(&weirv1.AcquireRequest{KeyHash: key, Model: "claude-sonnet-4-5"})
	u.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200, Headers: headers})
	got := u.getAccount(a.Id)
	fh, sd := window(got, windowFiveHour), window(got, windowSevenDay)
	if fh == nil || *fh.Utilization != 0.37 || fh.Source != sourceHeader || sd == nil || *sd.Utilization != 0.12 {
		t.Fatalf("usage after Release: %v", got.Usage)
	}
	if got.UsageReadAt != nil {
		t.Error("a header merge is not a read of the usage endpoint")
	}

	// A lease granted under the old credential reports after the new one
	// is in: its headers do not land.
	l = u.mustLease(&weirv1.AcquireRequest{KeyHash: key, Model: "claude-sonnet-4-5"})
	next := oauthToken()
	u.secrets.add(next)
	if _, err := u.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: a.Id, Credential: next, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
	})); err != nil {
		t.Fatal(err)
	}
	headers["anthropic-ratelimit-unified-5h-utilization"] = "0.80"
	u.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200, Headers: headers})
	if fh := window(u.getAccount(a.Id), windowFiveHour); *fh.Utilization != 0.37 {
		t.Fatalf("a reading under the old credential landed: %v", *fh.Utilization)
	}
}

// Every read of a usage endpoint goes through the budget: fetchUsage is
// called from readUsage alone, it alone calls package upstream's usage
// readers, and they alone use the endpoints' paths; no function of either
// package names an endpoint otherwise.
func TestUsageReadsOnlyThroughTheBudget(t *testing.T) {
	t.Parallel()
	// The one function each name may appear in, besides its declaration.
	only := map[string]string{
		"fetchUsage":         "readUsage",
		"ReadModels":         "checkRead",
		"ReadAnthropicUsage": "fetchUsage",
		"ReadCodexUsage":     "fetchUsage",
		"AnthropicUsagePath": "ReadAnthropicUsage",
		"CodexUsagePath":     "ReadCodexUsage",
	}
	var files []string
	for _, glob := range []string{"*.go", "upstream/*.go"} {
		m, err := filepath.Glob(glob)
		if err != nil || len(m) == 0 {
			t.Fatalf("%s: %v", glob, err)
		}
		files = append(files, m...)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.Ident:
					if in, ok := only[n.Name]; ok && n != fn.Name && fn.Name.Name != in {
						t.Errorf("%s: %s uses %s (only %s may)", fset.Position(n.Pos()), fn.Name.Name, n.Name, in)
					}
				case *ast.BasicLit:
					if n.Kind == token.STRING && (strings.Contains(n.Value, "oauth/usage") || strings.Contains(n.Value, "wham/usage")) {
						t.Errorf("%s: %s names a usage endpoint", fset.Position(n.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
}

// The budget is SQL: a claim refused for one account does not stop
// another's.
func TestUsageBudgetIsPerAccount(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, maxAccount("a"), maxAccount("b"))
	for _, label := range []string{"a", "b"} {
		if r := u.refresh(accts[label].Id); !r.Read {
			t.Fatalf("%s: refused", label)
		}
	}
	if n := u.usageReads(); n != 2 {
		t.Fatalf("%d reads, want 2", n)
	}
	if r := u.refresh("a"); r.Read {
		t.Fatal("a second read of a was allowed")
	}
}

// With jobs on, River runs the poller on start: an account is read without
// anyone asking, and its reading lands.
func TestUsagePollerRunsUnderRiver(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	clock := newClock()
	u := &usageEnv{}
	read := make(chan struct{}, 1)
	u.hook = func(*http.Request) {
		select {
		case read <- struct{}{}:
		default:
		}
	}
	cfg := testConfig(clock)
	cfg.DisableJobs = false
	cfg.UsageClient = &http.Client{Transport: hookTransport{u}, Timeout: 10 * time.Second}
	u.env = newEnv(t, pool, cfg, clock)
	script := maxAccount("max")
	u.sim = sim.New(sim.Config{Now: clock.Now, Script: sim.Script{Accounts: []sim.AccountScript{script}}})
	ts := httptest.NewServer(u.sim)
	t.Cleanup(ts.Close)
	a, _ := u.createAccount(acct{label: "max", credential: script.Credential, kind: weirv1.AuthKind_AUTH_KIND_OAUTH, baseURL: ts.URL})

	if err := u.srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-read:
	case <-time.After(30 * time.Second):
		t.Fatal("River did not run the usage poller within 30s")
	}
	// Stop waits for the running poll to finish.
	if err := u.srv.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := u.getAccount(a.Id); window(got, windowFiveHour) == nil || got.UsageReadAt == nil {
		t.Fatalf("after the poll: usage %v read at %v", got.Usage, got.UsageReadAt)
	}
}
