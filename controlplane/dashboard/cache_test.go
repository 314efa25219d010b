package dashboard

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// cacheService is a UsageService served over HTTP whose ExplainCache
// gives answer, or Unimplemented while answer is nil: what a control
// plane without the handler answers. It keeps the last request.
type cacheService struct {
	weirv1connect.UnimplementedUsageServiceHandler
	answer *weirv1.ExplainCacheResponse
	mu     sync.Mutex
	asked  *weirv1.ExplainCacheRequest
}

func (c *cacheService) ExplainCache(ctx context.Context, req *connect.Request[weirv1.ExplainCacheRequest]) (*connect.Response[weirv1.ExplainCacheResponse], error) {
	c.mu.Lock()
	c.asked = req.Msg
	c.mu.Unlock()
	if c.answer == nil {
		return c.UnimplementedUsageServiceHandler.ExplainCache(ctx, req)
	}
	return connect.NewResponse(c.answer), nil
}

var cacheNow = time.Date(2030, 3, 4, 5, 6, 7, 0, time.UTC)

// cachePage serves the dashboard over svc and gets path with the admin
// token.
func cachePage(t *testing.T, svc *cacheService, path string) (int, string) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(weirv1connect.NewUsageServiceHandler(svc))
	cp := httptest.NewServer(mux)
	t.Cleanup(cp.Close)
	const token = "admin-token-for-the-cache-page"
	dash := httptest.NewServer(New(Config{AdminToken: token, Usage: weirv1connect.NewUsageServiceClient(cp.Client(), cp.URL),
		Now: func() time.Time { return cacheNow }}))
	t.Cleanup(dash.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, dash.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := dash.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(body)
}

// TestCachePageUnavailable: a control plane that does not answer
// ExplainCache gets a page that says the view is not available and where
// the session's numbers are instead, not an error.
func TestCachePageUnavailable(t *testing.T) {
	t.Parallel()
	status, body := cachePage(t, &cacheService{}, "/dashboard/usage/cache?range=7d")
	if status != http.StatusOK {
		t.Fatalf("status %d, want 200:\n%s", status, body)
	}
	for _, want := range []string{
		`<p class="note unavailable" role="status"><strong>Not available:</strong>`, "UsageService.ExplainCache",
		`href="/dashboard/usage?range=7d&amp;by=session"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "Misses by key") {
		t.Error("the unavailable page shows an empty breakdown")
	}
}

// TestCachePageRendersAnswer: ExplainCache's sessions and misses as the
// page shows them, the causes summed per key, over the range and key
// asked.
func TestCachePageRendersAnswer(t *testing.T) {
	t.Parallel()
	at := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(cacheNow.Add(d)) }
	svc := &cacheService{answer: &weirv1.ExplainCacheResponse{Sessions: []*weirv1.SessionCache{
		{SessionKey: "s-1", KeyId: "k1", KeyName: "alice", FirstAt: at(-3 * time.Hour), LastAt: at(-time.Hour), Requests: 12,
			InputTokens: 1000, CacheReadTokens: 6000, CacheCreationTokens: 3000, CacheHitRatio: 0.6,
			Causes: map[string]int32{"moved": 1, "expired": 1},
			Misses: []*weirv1.CacheMiss{
				{RequestId: "req-moved", StartedAt: at(-2 * time.Hour), Cause: "moved", Why: "failover from acct-a: 429 rate limited",
					AccountId: "a2", AccountLabel: "acct-b", PreviousAccountId: "a1", PreviousAccountLabel: "acct-a",
					Gap: durationpb.New(90 * time.Second), UncachedInputTokens: 2500},
				{RequestId: "req-expired", StartedAt: at(-time.Hour), Cause: "expired", Why: "7m since the previous request",
					AccountId: "a2", AccountLabel: "acct-b", PreviousAccountId: "a2", PreviousAccountLabel: "acct-b",
					Gap: durationpb.New(7 * time.Minute), UncachedInputTokens: 1500},
			}},
		{SessionKey: "s-2", KeyId: "k1", KeyName: "alice", FirstAt: at(-time.Hour), LastAt: at(-time.Minute), Requests: 3,
			InputTokens: 10, CacheReadTokens: 0, CacheCreationTokens: 990, Causes: map[string]int32{"prefix_changed": 1},
			Misses: []*weirv1.CacheMiss{{RequestId: "req-prefix", StartedAt: at(-time.Minute), Cause: "prefix_changed",
				AccountId: "a1", AccountLabel: "acct-a", PreviousAccountId: "a1", PreviousAccountLabel: "acct-a",
				Gap: durationpb.New(20 * time.Second), UncachedInputTokens: 1000}}},
	}}}
	status, body := cachePage(t, svc, "/dashboard/usage/cache?range=7d&key=alice&tz=Europe/Berlin")
	if status != http.StatusOK {
		t.Fatalf("status %d:\n%s", status, body)
	}
	svc.mu.Lock()
	asked := svc.asked
	svc.mu.Unlock()
	if asked.Key != "alice" || !asked.Since.AsTime().Equal(cacheNow.Add(-7*24*time.Hour)) || !asked.Until.AsTime().Equal(cacheNow) {
		t.Errorf("ExplainCache asked %v, want alice's last 7 days", asked)
	}
	for _, want := range []string{
		// The breakdown: alice's two sessions, 15 requests, 6000 read of
		// 11000 input, a miss of each cause, 5000 uncached.
		`<td data-label="Sessions" class="num">2</td>`, `<td data-label="Requests" class="num">15</td>`,
		`<td data-label="Cache hit" class="num">55%</td>`, `<td data-label="Moved" class="num">1</td>`,
		`<td data-label="Expired" class="num">1</td>`, `<td data-label="Prefix changed" class="num">1</td>`,
		`<td data-label="Uncached" class="num">5,000</td>`,
		// The move, in Berlin's time, linked to its request.
		`<tr class="cause-moved">`, `<time>2030-03-04 04:06:07</time>`,
		`<a class="request-link" href="/dashboard/requests/req-moved">req-moved</a>`,
		`<td data-label="Why">failover from acct-a: 429 rate limited</td>`,
		`<td data-label="Before">acct-a</td>`, `<td data-label="After">acct-b</td>`, `<td data-label="Gap">1m 30s</td>`,
		`<td data-label="Uncached" class="num">2,500</td>`,
		`<span class="badge cause">1 moved</span> <span class="badge cause">1 expired</span>`,
		`<td data-label="Cause">prefix changed</td>`,
		`href="/dashboard/usage/cache?range=7d&amp;session=s-2&amp;tz=Europe%2FBerlin"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if !strings.Contains(body, `data-session="s-1" open`) || !strings.Contains(body, `data-session="s-2" open`) {
		t.Error("two sessions listed, and not both open")
	}
}

// TestDatedTicks: ticks fall on whole local hours across a change of
// daylight saving time, and every label carries its date.
func TestDatedTicks(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	// Berlin moves to summer time at 02:00 on 2030-03-31.
	from := time.Date(2030, 3, 30, 22, 0, 0, 0, time.UTC)
	var got []string
	for _, tk := range datedTicks(from, from.Add(24*time.Hour), berlin, 8) {
		got = append(got, tk.label)
	}
	want := []string{"Mar 31 00:00", "Mar 31 03:00", "Mar 31 06:00", "Mar 31 09:00", "Mar 31 12:00", "Mar 31 15:00", "Mar 31 18:00", "Mar 31 21:00", "Apr 1 00:00"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("ticks %q, want %q", got, want)
	}
	got = got[:0]
	for _, tk := range datedTicks(from, from.Add(30*24*time.Hour), berlin, 8) {
		got = append(got, tk.label)
	}
	if want := []string{"Apr 1", "Apr 8", "Apr 15", "Apr 22", "Apr 29"}; strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("30 days: ticks %q, want the Mondays %q", got, want)
	}
}
