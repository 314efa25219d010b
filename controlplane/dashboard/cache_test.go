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

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// cacheService is a UsageService served over HTTP whose ExplainCache
// answers Unimplemented while answer is nil: what a control plane older
// than the handler answers during a rolling upgrade (the real handler's
// page is TestDashboardPromptCache's, in package controlplane). It keeps
// the last request.
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
