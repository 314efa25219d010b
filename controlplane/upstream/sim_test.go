package upstream

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

// startSim serves accounts from the simulator over real HTTP, on its own
// clock, which starts at epoch and stands still.
func startSim(t *testing.T, accounts ...sim.AccountScript) (*sim.Server, string) {
	t.Helper()
	s := sim.New(sim.Config{Now: func() time.Time { return epoch }, ManualClock: true, Script: sim.Script{Accounts: accounts}})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

func client(t *testing.T) *http.Client {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// requireNoSecret fails if err's text holds any of secrets.
func requireNoSecret(t *testing.T, err error, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if err != nil && strings.Contains(err.Error(), s) {
			t.Fatalf("the error holds a token: %v", err)
		}
	}
}

// simReads counts the simulator's answers on path, by status.
func simReads(s *sim.Server, path string, status int) int {
	n := 0
	for _, a := range s.Attempts() {
		if a.Path == path && a.Status == status {
			n++
		}
	}
	return n
}

// A Claude login's usage is read with its bearer and the OAuth beta, its
// windows as fractions; the grants are asked for only when wanted; a
// spent read budget is the endpoint's 429 with its retry-after; a wrong
// token is refused, and no error holds a token.
func TestReadAnthropicUsage(t *testing.T) {
	t.Parallel()
	token := "sk-ant-oat01-" + randid.Hex(40)
	s, base := startSim(t, sim.AccountScript{Name: "max", Kind: sim.KindOAuth, Credential: token,
		FiveHourUtilization: 0.45, SevenDayUtilization: 0.2, UsageReadsPer10m: 2})
	c := client(t)

	u, wait, err := ReadAnthropicUsage(t.Context(), c, base, token, false)
	if err != nil || wait != 0 {
		t.Fatalf("read: %v (wait %v)", err, wait)
	}
	if len(u.Readings) != 2 || u.Readings[0].Window != FiveHour || u.Readings[1].Window != SevenDay ||
		*u.Readings[0].Utilization != 0.45 || *u.Readings[1].Utilization != 0.2 ||
		!u.Readings[0].ResetsAt.After(epoch) || !u.Readings[1].ResetsAt.After(*u.Readings[0].ResetsAt) {
		t.Fatalf("readings %s", readingsText(u.Readings))
	}
	if strings.Contains(string(u.Body), "reset_grants") {
		t.Error("grants came without being asked for")
	}
	u, _, err = ReadAnthropicUsage(t.Context(), c, base, token, true)
	if err != nil || !strings.Contains(string(u.Body), `"reset_grants"`) {
		t.Fatalf("read with grants: %v, body %s", err, u.Body)
	}
	if n := simReads(s, AnthropicUsagePath, http.StatusOK); n != 2 {
		t.Fatalf("%d good reads of %s, want 2", n, AnthropicUsagePath)
	}

	_, wait, err = ReadAnthropicUsage(t.Context(), c, base, token, false)
	if err == nil || err.Error() != "usage endpoint answered 429" || wait <= 0 || wait > maxRetryAfter {
		t.Fatalf("over the read budget: %v, wait %v", err, wait)
	}
	requireNoSecret(t, err, token)

	other := "sk-ant-oat01-" + randid.Hex(40)
	_, _, err = ReadAnthropicUsage(t.Context(), c, base, other, false)
	if err == nil || err.Error() != "usage endpoint answered 401" {
		t.Fatalf("an unknown token: %v", err)
	}
}

// A ChatGPT login's Codex usage is read with its bearer and
// chatgpt-account-id, both windows named by length; without the account
// id the endpoint refuses.
func TestReadCodexUsage(t *testing.T) {
	t.Parallel()
	token := "cx-" + randid.Hex(40)
	s, base := startSim(t, sim.AccountScript{Name: "codex", Kind: sim.KindChatGPT, Credential: token,
		FiveHourUtilization: 0.25, SevenDayUtilization: 0.625})
	id, ok := s.ChatGPTAccountID("codex")
	if !ok {
		t.Fatal("the simulator names no ChatGPT account id")
	}
	c := client(t)
	readings, wait, err := ReadCodexUsage(t.Context(), c, base+"/backend-api", token, id, s.Now)
	if err != nil || wait != 0 {
		t.Fatalf("read: %v (wait %v)", err, wait)
	}
	if len(readings) != 2 || readings[0].Window != FiveHour || readings[1].Window != SevenDay ||
		*readings[0].Utilization != 0.25 || *readings[1].Utilization != 0.62 ||
		!readings[0].ResetsAt.After(epoch) || !readings[1].ResetsAt.After(*readings[0].ResetsAt) {
		t.Fatalf("readings %s", readingsText(readings))
	}
	if n := simReads(s, "/backend-api"+CodexUsagePath, http.StatusOK); n != 1 {
		t.Fatalf("%d good reads, want 1", n)
	}
	_, _, err = ReadCodexUsage(t.Context(), c, base+"/backend-api", token, "", s.Now)
	if err == nil || err.Error() != "usage endpoint answered 401" {
		t.Fatalf("without the account id: %v", err)
	}
	requireNoSecret(t, err, token)
}

// Each provider's refresh rotates both tokens at its token endpoint, as
// its CLI asks; a spent refresh token is refused for good
// (RefreshRejected), in each provider's way (Anthropic 400, OpenAI 401).
func TestRefresh(t *testing.T) {
	t.Parallel()
	claudeRefresh, codexRefresh := "sk-ant-ort01-"+randid.Hex(40), "rt_"+randid.Hex(32)
	s, base := startSim(t,
		sim.AccountScript{Name: "max", Kind: sim.KindOAuth, Credential: "sk-ant-oat01-" + randid.Hex(40), RefreshToken: claudeRefresh},
		sim.AccountScript{Name: "codex", Kind: sim.KindChatGPT, Credential: "cx-" + randid.Hex(40), RefreshToken: codexRefresh})
	c := client(t)
	codexURL, ok := CodexTokenURLUnder(base + "/backend-api")
	if !ok || codexURL != base+CodexTokenPath {
		t.Fatalf("codex token URL %q under %s", codexURL, base)
	}
	for _, tc := range []struct {
		name, account, refresh string
		call                   func(refresh string) (Tokens, error)
		wantIDToken            bool
	}{
		{"anthropic", "max", claudeRefresh, func(r string) (Tokens, error) {
			return RefreshAnthropic(t.Context(), c, base+AnthropicTokenPath, AnthropicClientID, r)
		}, false},
		{"codex", "codex", codexRefresh, func(r string) (Tokens, error) {
			return RefreshCodex(t.Context(), c, codexURL, CodexClientID, r)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := tc.call(tc.refresh)
			if err != nil {
				t.Fatal(err)
			}
			if !TokenShaped(tok.AccessToken) || !TokenShaped(tok.RefreshToken) || tok.RefreshToken == tc.refresh ||
				(tok.IDToken != "") != tc.wantIDToken {
				t.Fatalf("answer: access %v, rotated refresh %v, id token %v", TokenShaped(tok.AccessToken),
					tok.RefreshToken != tc.refresh, tok.IDToken != "")
			}
			if n := s.TokenRefreshes(tc.account); n != 1 {
				t.Fatalf("%d refreshes reached the simulator", n)
			}
			_, err = tc.call(tc.refresh)
			var rejected RefreshRejected
			if !errors.As(err, &rejected) || rejected.Code != "invalid_grant" ||
				err.Error() != "refresh token rejected by the provider: invalid_grant" {
				t.Fatalf("a spent refresh token: %v", err)
			}
			requireNoSecret(t, err, tc.refresh, tok.AccessToken, tok.RefreshToken)
		})
	}
}

// roundTripFunc is a transport that fails as a broken network does.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A transport failure whose words quote the token (a proxy's error page,
// a dialer echoing its input) reaches the caller scrubbed, still the
// failure it was for errors.Is.
func TestTransportErrorsHoldNoToken(t *testing.T) {
	t.Parallel()
	token := "sk-ant-oat01-" + randid.Hex(40)
	c := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, errors.Join(errors.New("proxy refused "+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")+" and "+token), syscall.ECONNREFUSED)
	})}
	_, _, err := ReadAnthropicUsage(t.Context(), c, "http://usage.invalid", token, false)
	if err == nil || !strings.HasPrefix(err.Error(), "usage endpoint unreachable: ") || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("usage: %v", err)
	}
	requireNoSecret(t, err, token)
	_, err = RefreshCodex(t.Context(), c, "http://auth.invalid/oauth/token", CodexClientID, token)
	if err == nil || !strings.HasPrefix(err.Error(), "token endpoint unreachable: ") || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("refresh: %v", err)
	}
	requireNoSecret(t, err, token)
	if !strings.Contains(err.Error(), "[credential]") {
		t.Errorf("the token was not marked where it stood: %v", err)
	}
}
