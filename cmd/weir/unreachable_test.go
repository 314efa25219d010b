package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/poolstatus"
)

// TestStatusUnreachable: an account whose upstream stays unreachable is
// shown as such, from its run of transport failures (cause, host, since,
// attempts), in place of its transport cooldown; one that cools for
// another reason keeps its cooling line.
func TestStatusUnreachable(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 12, 17, 0, 0, time.UTC)
	since := now.Add(-14 * time.Minute)
	gone := &weirv1.Account{Label: "gone", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: weirv1.AccountState_ACCOUNT_STATE_COOLING,
		Cooldown: &weirv1.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT, Until: timestamppb.New(now.Add(5 * time.Second)),
			Evidence: "transport_error, dns: no such host, 14 attempts since …"},
		Unreachable: &weirv1.Unreachable{Cause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS, Error: "no such host", Host: "api.example.invalid",
			Since: timestamppb.New(since), LastAt: timestamppb.New(now.Add(-5 * time.Second)), Attempts: 14}}
	limited := &weirv1.Account{Label: "limited", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: weirv1.AccountState_ACCOUNT_STATE_COOLING,
		Cooldown: &weirv1.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED, Until: timestamppb.New(now.Add(time.Minute)), Evidence: "rate_limited, status 429"}}
	st := poolstatus.Build([]*weirv1.Account{limited, gone}, &weirv1.Settings{}, nil, now)
	if len(st.Problems) != 2 {
		t.Fatalf("problems %+v, want one each", st.Problems)
	}
	p := st.Problems[0]
	if p.Kind != "unreachable" || p.Account != "gone" || p.Cause != "dns" || p.Attempts != 14 || !p.Since.Equal(since) || p.Until != nil {
		t.Errorf("first problem %+v, want gone unreachable (worst first)", p)
	}
	if st.Problems[1].Kind != "cooling" || st.Problems[1].Account != "limited" {
		t.Errorf("second problem %+v", st.Problems[1])
	}
	var b strings.Builder
	if err := printStatus(&b, st, false); err != nil {
		t.Fatal(err)
	}
	want := "unreachable gone: dns no such host for api.example.invalid since " + since.Local().Format("15:04") + ", 14 attempts, the last 5s ago\n"
	if !strings.Contains(b.String(), want) || !strings.Contains(b.String(), "cooling     limited: rate_limited, status 429") {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}

// TestExplainTransportCause: an attempt that got no answer shows its
// transport cause where an answer's error type would be.
func TestExplainTransportCause(t *testing.T) {
	t.Parallel()
	ev := &weirv1.RouteEvent{RequestId: "weir_1", Status: 503, Attempts: 1, AttemptRecords: []*weirv1.AttemptRecord{
		{At: durationpb.New(0), AccountId: "a1", Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, Action: weirv1.Action_ACTION_FAILOVER,
			TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED},
		{At: durationpb.New(time.Millisecond), HoldReason: "every account's upstream is unreachable: refused: connection refused for 127.0.0.1",
			Duration: durationpb.New(10 * time.Second)},
	}}
	var b strings.Builder
	if err := printExplain(&b, ev, map[string]string{"a1": "gone"}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	var attempt string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "gone") {
			attempt = strings.Join(strings.Fields(l), " ")
		}
	}
	if attempt != "+0s gone transport_error - refused failover - -" {
		t.Errorf("attempt line %q:\n%s", attempt, b.String())
	}
	if !strings.Contains(b.String(), "every account's upstream is unreachable: refused") {
		t.Errorf("the hold's reason is missing:\n%s", b.String())
	}
}
