package controlplane

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// leased is a fresh environment with one account and one lease on it.
func leased(t *testing.T) (*env, *weirv1.Account, *weirv1.Lease, string) {
	t.Helper()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{})
	return e, a, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}), keyHash
}

func TestReleaseSuccess(t *testing.T) {
	t.Parallel()
	e, a, l, _ := leased(t)
	if _, err := e.pool.Exec(t.Context(), `UPDATE accounts SET auth_failures = 2 WHERE id = $1`, a.Id); err != nil {
		t.Fatal(err)
	}
	now := e.clock.Advance(3 * time.Second)
	d := e.release(l.Id, &weirv1.Outcome{
		Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200, Usage: &weirv1.TokenUsage{InputTokens: 10, OutputTokens: 20},
		Duration: durationpb.New(time.Second),
	})
	if d.Action != weirv1.Action_ACTION_RESPOND || d.Cooldown != nil || d.RetryAfter != nil {
		t.Errorf("decision %v", d)
	}
	row := e.accountRow(a.Id)
	if row.LastSuccessAt == nil || !row.LastSuccessAt.Equal(now) || row.AuthFailures != 0 {
		t.Errorf("last_success_at %v auth_failures %d", row.LastSuccessAt, row.AuthFailures)
	}
	if e.cooldownRow(a.Id) != nil {
		t.Error("success wrote a cooldown")
	}
	if n := e.count(`SELECT count(*) FROM leases`); n != 0 {
		t.Errorf("%d leases after release", n)
	}
	if got := e.getAccount(a.Id); got.LastSuccessAt == nil || !got.LastSuccessAt.AsTime().Equal(now) {
		t.Errorf("GetAccount last_success_at %v", got.LastSuccessAt)
	}
	// Released twice: the second is unknown.
	_, err := e.dp.leases.Release(t.Context(), connect.NewRequest(&weirv1.ReleaseRequest{
		LeaseId: l.Id, Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS},
	}))
	wantCode(t, err, connect.CodeNotFound)
}

func TestReleaseInvalid(t *testing.T) {
	t.Parallel()
	e, _, l, _ := leased(t)
	for _, tc := range []struct {
		name string
		req  *weirv1.ReleaseRequest
		code connect.Code
	}{
		{"unknown lease", &weirv1.ReleaseRequest{LeaseId: uuid.NewString(), Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS}}, connect.CodeNotFound},
		{"malformed id", &weirv1.ReleaseRequest{LeaseId: "lease-1", Outcome: &weirv1.Outcome{}}, connect.CodeInvalidArgument},
		{"no outcome", &weirv1.ReleaseRequest{LeaseId: l.Id}, connect.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.dp.leases.Release(t.Context(), connect.NewRequest(tc.req))
			wantCode(t, err, tc.code)
		})
	}
	// The invalid calls left the real lease alone.
	if n := e.count(`SELECT count(*) FROM leases WHERE id = $1`, l.Id); n != 1 {
		t.Error("an invalid Release consumed the lease")
	}
}

// TestReleaseAuthErrorEscalates: consecutive credential rejections cool
// the account for 1, 2, 4 minutes (non-transient) and the third marks it
// broken with a reason operators see.
func TestReleaseAuthErrorEscalates(t *testing.T) {
	t.Parallel()
	e, a, l, keyHash := leased(t)
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		now := e.clock.Now()
		d := e.release(l.Id, &weirv1.Outcome{
			Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401, ErrorType: "authentication_error",
		})
		if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown == nil ||
			d.Cooldown.Reason != weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL || d.Cooldown.Transient {
			t.Fatalf("rejection %d: decision %v", i+1, d)
		}
		if !d.Cooldown.Until.AsTime().Equal(now.Add(want)) {
			t.Errorf("rejection %d: until %v, want now+%v", i+1, d.Cooldown.Until.AsTime().Sub(now), want)
		}
		cd := e.cooldownRow(a.Id)
		if cd == nil || cd.Reason != "invalid_credential" || cd.Transient || !cd.Until.Equal(now.Add(want)) {
			t.Errorf("rejection %d: stored cooldown %+v", i+1, cd)
		}
		row := e.accountRow(a.Id)
		if row.AuthFailures != int32(i+1) {
			t.Errorf("rejection %d: auth_failures %d", i+1, row.AuthFailures)
		}
		got := e.getAccount(a.Id)
		if i < 2 {
			if got.State != weirv1.AccountState_ACCOUNT_STATE_COOLING || got.BrokenReason != "" || row.BrokenAt != nil {
				t.Errorf("rejection %d: state %v broken %q", i+1, got.State, got.BrokenReason)
			}
			// Wait out the cooldown, and try again.
			e.clock.Advance(want)
			l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
			continue
		}
		if got.State != weirv1.AccountState_ACCOUNT_STATE_BROKEN || row.BrokenAt == nil || !row.BrokenAt.Equal(now) {
			t.Fatalf("after 3 rejections: state %v broken_at %v", got.State, row.BrokenAt)
		}
		if !strings.Contains(got.BrokenReason, "credential rejected") || !strings.Contains(got.BrokenReason, "401") {
			t.Errorf("broken reason %q", got.BrokenReason)
		}
		list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if la := list.Msg.Accounts[0]; la.State != weirv1.AccountState_ACCOUNT_STATE_BROKEN || la.BrokenReason != got.BrokenReason {
			t.Errorf("ListAccounts: state %v reason %q", la.State, la.BrokenReason)
		}
	}
	// Broken outlasts the cooldown: only an operator brings it back.
	e.clock.Advance(24 * time.Hour)
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)
	e.resume(a.Id)
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
}

// TestReleaseSuccessResetsAuthFailures: rejections must be consecutive.
func TestReleaseSuccessResetsAuthFailures(t *testing.T) {
	t.Parallel()
	e, a, l, keyHash := leased(t)
	l2 := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	l3 := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401})
	e.release(l2.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 403})
	if row := e.accountRow(a.Id); row.AuthFailures != 2 {
		t.Fatalf("auth_failures %d", row.AuthFailures)
	}
	e.release(l3.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	if row := e.accountRow(a.Id); row.AuthFailures != 0 || row.BrokenAt != nil {
		t.Fatalf("after a success: auth_failures %d", row.AuthFailures)
	}
}

func TestReleaseRateLimited(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		headers func(now time.Time) map[string]string
		want    time.Duration
	}{
		{"retry-after seconds", func(time.Time) map[string]string { return map[string]string{"retry-after": "30"} }, 30 * time.Second},
		{"retry-after-ms", func(time.Time) map[string]string { return map[string]string{"retry-after-ms": "2500"} }, 2500 * time.Millisecond},
		{"unified reset", func(now time.Time) map[string]string {
			return map[string]string{"anthropic-ratelimit-unified-reset": strconv.FormatInt(now.Add(17*time.Minute).Unix(), 10),
				"anthropic-ratelimit-unified-status": "rejected"}
		}, 17 * time.Minute},
		{"nothing", func(time.Time) map[string]string { return nil }, 60 * time.Second},
		{"retry-after date", func(now time.Time) map[string]string {
			return map[string]string{"retry-after": now.Add(45 * time.Second).Format(http.TimeFormat)}
		}, 45 * time.Second},
		{"retry-after past date", func(now time.Time) map[string]string {
			return map[string]string{"retry-after": now.Add(-time.Hour).Format(http.TimeFormat)}
		}, 60 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, a, l, _ := leased(t)
			now := e.clock.Advance(time.Second)
			h := tc.headers(now)
			d := e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429,
				ErrorType: "rate_limit_error", Headers: h})
			if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown == nil ||
				d.Cooldown.Reason != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED || !d.Cooldown.Transient {
				t.Fatalf("decision %v", d)
			}
			want := now.Add(tc.want)
			if !d.Cooldown.Until.AsTime().Equal(want) {
				t.Errorf("decision until now+%v, want now+%v", d.Cooldown.Until.AsTime().Sub(now), tc.want)
			}
			cd := e.cooldownRow(a.Id)
			if cd == nil || !cd.Until.Equal(want) || cd.Reason != "rate_limited" || !cd.Transient || !cd.WrittenAt.Equal(now) {
				t.Fatalf("stored cooldown %+v", cd)
			}
			// The evidence is stored as JSON with the headers that justified it.
			var ev policy.Evidence
			if err := json.Unmarshal(cd.Evidence, &ev); err != nil {
				t.Fatalf("evidence: %v", err)
			}
			if ev.Class != "rate_limited" || ev.Status != 429 || ev.ErrorType != "rate_limit_error" || len(ev.Headers) != len(h) {
				t.Errorf("evidence %+v", ev)
			}
			for k, v := range h {
				if ev.Headers[k] != v {
					t.Errorf("evidence header %s = %q, want %q", k, ev.Headers[k], v)
				}
			}
			got := e.getAccount(a.Id)
			if got.State != weirv1.AccountState_ACCOUNT_STATE_COOLING || got.Cooldown == nil ||
				!strings.HasPrefix(got.Cooldown.Evidence, "rate_limited, status 429, rate_limit_error") ||
				got.Cooldown.Evidence != d.Cooldown.Evidence || !got.Cooldown.Until.AsTime().Equal(want) {
				t.Errorf("account view: %v", got)
			}
			if ra := h["retry-after"]; ra != "" && !strings.Contains(got.Cooldown.Evidence, "retry-after "+ra) {
				t.Errorf("evidence summary %q misses retry-after", got.Cooldown.Evidence)
			}
			// Cooling ends with its deadline.
			e.clock.Advance(tc.want - time.Millisecond)
			if e.getAccount(a.Id).State != weirv1.AccountState_ACCOUNT_STATE_COOLING {
				t.Error("cooldown ended early")
			}
			e.clock.Advance(time.Millisecond)
			if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil {
				t.Errorf("cooldown outlived its deadline: %v", got.State)
			}
		})
	}
}

func TestReleaseOtherClasses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		outcome  *weirv1.Outcome
		action   weirv1.Action
		reason   weirv1.CooldownReason // UNSPECIFIED: no cooldown
		duration time.Duration
	}{
		{"transport error", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "dial tcp: connection refused"},
			weirv1.Action_ACTION_FAILOVER, weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT, 10 * time.Second},
		{"overloaded", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, ErrorType: "overloaded_error"},
			weirv1.Action_ACTION_RETRY_SAME, 0, 0},
		{"client error", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR, Status: 400, ErrorType: "invalid_request_error"},
			weirv1.Action_ACTION_RESPOND, 0, 0},
		{"stream error", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, Status: 200, BytesToClient: true},
			weirv1.Action_ACTION_RESPOND, 0, 0},
		{"client canceled", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED},
			weirv1.Action_ACTION_RESPOND, 0, 0},
		{"upstream error", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR, Status: 418},
			weirv1.Action_ACTION_RESPOND, 0, 0},
		{"rate limited after bytes", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, BytesToClient: true},
			weirv1.Action_ACTION_RESPOND, weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED, 60 * time.Second},
		{"transport after bytes", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, BytesToClient: true},
			weirv1.Action_ACTION_RESPOND, weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT, 10 * time.Second},
		{"overloaded after bytes", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, BytesToClient: true},
			weirv1.Action_ACTION_RESPOND, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, a, l, keyHash := leased(t)
			now := e.clock.Now()
			d := e.release(l.Id, tc.outcome)
			if d.Action != tc.action {
				t.Errorf("action %v, want %v", d.Action, tc.action)
			}
			cd := e.cooldownRow(a.Id)
			if tc.reason == 0 {
				if d.Cooldown != nil || cd != nil {
					t.Fatalf("unexpected cooldown: %v / %+v", d.Cooldown, cd)
				}
				// Still routable.
				e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
				return
			}
			if d.Cooldown == nil || d.Cooldown.Reason != tc.reason || !d.Cooldown.Until.AsTime().Equal(now.Add(tc.duration)) || !d.Cooldown.Transient {
				t.Fatalf("decision cooldown %v", d.Cooldown)
			}
			if cd == nil || cd.Reason != enumName(tc.reason) || !cd.Until.Equal(now.Add(tc.duration)) {
				t.Fatalf("stored cooldown %+v", cd)
			}
			if tc.outcome.TransportError != "" && !strings.Contains(e.getAccount(a.Id).Cooldown.Evidence, tc.outcome.TransportError) {
				t.Error("evidence summary misses the transport error")
			}
			e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
		})
	}
}

// TestReleaseCooldownSeenByOtherReplica: a cooldown written through one
// replica is honoured by the next Acquire on another.
func TestReleaseCooldownSeenByOtherReplica(t *testing.T) {
	t.Parallel()
	e, a, l, keyHash := leased(t)
	r := e.replica()
	b, _ := e.createAccount(acct{})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429})
	for range 3 {
		if got := r.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); got.AccountId != b.Id {
			t.Fatalf("replica leased the cooling account %s", a.Label)
		}
	}
}

// TestReleaseMetrics: releases and cooldowns are counted by class/reason.
func TestReleaseMetrics(t *testing.T) {
	t.Parallel()
	e, _, l, _ := leased(t)
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429})
	body := scrape(t, e)
	for _, want := range []string{
		`weir_controlplane_releases_total{class="rate_limited"} 1`,
		`weir_controlplane_cooldowns_written_total{reason="rate_limited"} 1`,
		`weir_controlplane_acquire_seconds_count{result="lease"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestReleaseAfterRotationBlamesOldCredential: a request that was in flight
// on the old credential when an operator rotated it comes back 401 (the
// old key is revoked). That verdict is about the old credential and must
// not cool, count against or break the new one.
func TestReleaseAfterRotationBlamesOldCredential(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{})
	var inFlight []*weirv1.Lease
	for range 3 {
		inFlight = append(inFlight, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}))
	}
	newCred := apiKey()
	e.secrets.add(newCred)
	if _, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: a.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}}, Credential: newCred,
	})); err != nil {
		t.Fatal(err)
	}
	for _, l := range inFlight {
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401})
	}
	got := e.getAccount(a.Id)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil {
		t.Errorf("the new credential was blamed for the old one's rejections: state %v, broken %q", got.State, got.BrokenReason)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.Credential != newCred {
		t.Error("no lease with the new credential")
	}
}
