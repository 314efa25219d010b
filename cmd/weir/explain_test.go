package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestExplainFoldsAHold: a minute's hold through a storm, a probe and a
// wait every 2 s round three accounts, reads in a few rows: the probes and
// waits folded into one counted pair, the accounts counted, the waits
// summed; what differs (the first same-account retry, the success) stays.
func TestExplainFoldsAHold(t *testing.T) {
	t.Parallel()
	at := func(d time.Duration) *durationpb.Duration { return durationpb.New(d) }
	overloaded := func(d time.Duration, acct string, action weirv1.Action) *weirv1.AttemptRecord {
		return &weirv1.AttemptRecord{At: at(d), AccountId: acct, Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529,
			ErrorType: "overloaded_error", Action: action, Duration: at(10 * time.Millisecond)}
	}
	hold := func(d, held time.Duration, why string) *weirv1.AttemptRecord {
		return &weirv1.AttemptRecord{At: at(d), HoldReason: why, Duration: at(held)}
	}
	recs := []*weirv1.AttemptRecord{
		overloaded(0, "a", weirv1.Action_ACTION_RETRY_SAME),
		hold(0, time.Second, "overloaded; retrying the same account"),
	}
	const breaker = "the provider is overloaded for sonnet models; weir is probing it before sending more"
	for i := range 30 {
		d := time.Second + time.Duration(i)*2*time.Second
		recs = append(recs, overloaded(d, []string{"a", "b", "c"}[i%3], weirv1.Action_ACTION_FAILOVER), hold(d, 2*time.Second, breaker))
	}
	recs = append(recs, &weirv1.AttemptRecord{At: at(61 * time.Second), AccountId: "b", Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS,
		Status: 200, Action: weirv1.Action_ACTION_RESPOND})
	ev := &weirv1.RouteEvent{RequestId: "weir_x", Model: "claude-sonnet-4-5", Status: 200, Attempts: 32, HoldCount: 31,
		Held: at(61 * time.Second), AttemptRecords: recs}
	var out bytes.Buffer
	if err := printExplain(&out, ev, map[string]string{"a": "max-a", "b": "max-b", "c": "max-c"}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	timeline := text[strings.Index(text, "timeline"):]
	if rows := strings.Count(timeline, "\n") - 2; rows != 5 {
		t.Errorf("timeline of %d rows, want 5 (retry, its wait, the folded probe and wait, the success):\n%s", rows, timeline)
	}
	for _, want := range []string{"3 accounts", "(×30)", "1m0s", breaker, "max-b"} {
		if !strings.Contains(timeline, want) {
			t.Errorf("timeline lacks %q:\n%s", want, timeline)
		}
	}
}

// TestExplainHeldNow: a request held now says so, since when, why, its
// attempts so far and its next try, with its timeline so far; a stream
// that failed after output says that, not a plain 200; a failure says why
// in one line.
func TestExplainHeldNow(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)
	ev := &weirv1.RouteEvent{RequestId: "weir_held", Model: "gpt-5-codex", Pending: true, Attempts: 3,
		StartedAt: timestamppb.New(now.Add(-30 * time.Second)), HeldSince: timestamppb.New(now.Add(-29 * time.Second)),
		NextTryAt: timestamppb.New(now.Add(2 * time.Second)), HoldReason: "all 2 eligible accounts were tried for this request",
		AttemptRecords: []*weirv1.AttemptRecord{{At: durationpb.New(0), AccountId: "a", Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED,
			Status: 503, Action: weirv1.Action_ACTION_FAILOVER}}}
	var out bytes.Buffer
	if err := printExplain(&out, ev, nil, nil, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"held\n", "for 29s", "3 attempts so far", "next try in 2s", "all 2 eligible accounts were tried", "timeline so far", "overloaded"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain of a held request lacks %q:\n%s", want, out.String())
		}
	}

	cut := &weirv1.RouteEvent{RequestId: "weir_cut", Status: 200, FailureStage: weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT,
		Verdict: "the upstream's answer is the client's: 200 overloaded_error (stream_error)"}
	out.Reset()
	if err := printExplain(&out, cut, nil, nil, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"200, failed mid-stream", "why", cut.Verdict} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain of a cut stream lacks %q:\n%s", want, out.String())
		}
	}
}

// TestFoldTimelineCycles: a probe and two waits repeating, the probes on
// accounts of which one is metered, fold into one counted cycle; the
// distinct notes are kept, the accounts counted, the waits summed.
func TestFoldTimelineCycles(t *testing.T) {
	t.Parallel()
	var rows []timelineRow
	for i := range 6 {
		attempt := timelineRow{account: []string{"max-1", "api-key"}[i%2], cols: [4]string{"overloaded", "529", "overloaded_error", "failover"},
			reason: []string{"-", "spill to a metered account"}[i%2], duration: time.Millisecond, timed: true}
		probing := timelineRow{account: "hold", cols: [4]string{"-", "-", "-", "-"}, reason: "probing", duration: 250 * time.Millisecond, timed: true}
		parked := timelineRow{account: "hold", cols: [4]string{"-", "-", "-", "-"}, reason: "parked", duration: time.Second, timed: true}
		rows = append(rows, attempt, probing, parked)
	}
	got := foldTimeline(rows)
	if len(got) != 3 {
		t.Fatalf("%d rows, want the cycle of 3 once: %+v", len(got), got)
	}
	if a := got[0]; a.times != 6 || len(a.accounts) != 2 || a.reason != "spill to a metered account" || a.duration != 6*time.Millisecond {
		t.Errorf("folded attempt %+v", a)
	}
	if w := got[2]; w.times != 6 || w.duration != 6*time.Second || w.reason != "parked" {
		t.Errorf("folded wait %+v", w)
	}
}

// TestExplainNamesTheProxy: an attempt that failed at its egress proxy
// reads as the proxy's failure, naming it by host; any other transport
// failure reads as its cause.
func TestExplainNamesTheProxy(t *testing.T) {
	t.Parallel()
	at := durationpb.New(0)
	proxyErr := "egress proxy socks5://10.0.0.7:1080 could not be reached (connection refused)"
	ev := &weirv1.RouteEvent{RequestId: "weir_p", Model: "claude-sonnet-4-5", Status: 200, Attempts: 3, AttemptRecords: []*weirv1.AttemptRecord{
		{At: at, AccountId: "a", Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, Action: weirv1.Action_ACTION_FAILOVER,
			TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_PROXY, TransportError: proxyErr},
		{At: at, AccountId: "b", Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, Action: weirv1.Action_ACTION_FAILOVER,
			TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS, TransportError: "no such host"},
		{At: at, AccountId: "c", Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200, Action: weirv1.Action_ACTION_RESPOND},
	}}
	var out bytes.Buffer
	if err := printExplain(&out, ev, map[string]string{"a": "behind-proxy", "b": "gone", "c": "ok"}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	var proxyLine, dnsLine string
	for _, l := range lines {
		switch {
		case strings.Contains(l, "behind-proxy"):
			proxyLine = l
		case strings.Contains(l, "gone"):
			dnsLine = l
		}
	}
	if !strings.Contains(proxyLine, proxyErr) {
		t.Errorf("the proxy's attempt reads %q, want it to name the proxy", proxyLine)
	}
	if !strings.Contains(dnsLine, "dns") || strings.Contains(dnsLine, "proxy") {
		t.Errorf("the dns attempt reads %q", dnsLine)
	}
}

// TestExplainNamesTheTranslation: an attempt served through translation
// says which, and as which model; one that was not says nothing of it.
func TestExplainNamesTheTranslation(t *testing.T) {
	t.Parallel()
	at := durationpb.New(0)
	ev := &weirv1.RouteEvent{RequestId: "weir_t", Model: "coder", Status: 200, Attempts: 2, AttemptRecords: []*weirv1.AttemptRecord{
		{At: at, AccountId: "a", Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, Action: weirv1.Action_ACTION_FAILOVER, Model: "claude-sonnet-4-5"},
		{At: at, AccountId: "b", Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200, Action: weirv1.Action_ACTION_RESPOND,
			Model: "gpt-5-codex", Translation: "messages>responses"},
	}}
	var out bytes.Buffer
	if err := printExplain(&out, ev, map[string]string{"a": "claude-max", "b": "codex-pro"}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out.String(), "\n") {
		switch {
		case strings.Contains(l, "codex-pro") && !strings.Contains(l, "translated messages → responses as gpt-5-codex"):
			t.Errorf("the translated attempt reads %q", l)
		case strings.Contains(l, "claude-max") && strings.Contains(l, "translated"):
			t.Errorf("the untranslated attempt reads %q", l)
		}
	}
}
