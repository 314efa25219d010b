package controlplane

import (
	"encoding/json"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestUnreachableOf: a run reads back with the account's upstream host
// (its override, else the provider's default), and evidence from before
// runs is a run of one from when it was written.
func TestUnreachableOf(t *testing.T) {
	t.Parallel()
	start := epoch.Add(-time.Minute)
	b, _ := json.Marshal(policy.Evidence{Class: "transport_error", TransportError: "no such host", Cause: "dns", Since: &start, Attempts: 14})
	run := db.Cooldown{Reason: "transport", Transient: true, Until: epoch.Add(5*time.Second + policy.TransportCooldown),
		WrittenAt: epoch.Add(5 * time.Second), Evidence: b}
	u := unreachableOf(run, "anthropic", "https://api.example.invalid:8443/v1")
	if u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_DNS || u.Error != "no such host" || u.Host != "api.example.invalid" ||
		!u.Since.AsTime().Equal(epoch.Add(-time.Minute)) || !u.LastAt.AsTime().Equal(epoch.Add(5*time.Second)) || u.Attempts != 14 {
		t.Errorf("run %v", u)
	}
	old := db.Cooldown{Reason: "transport", WrittenAt: epoch, Evidence: []byte(`{"class":"transport_error","transport_error":"connection refused"}`)}
	u = unreachableOf(old, "codex", "")
	if u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_OTHER || u.Host != "chatgpt.com" || !u.Since.AsTime().Equal(epoch) || u.Attempts != 1 {
		t.Errorf("run from old evidence %v", u)
	}
}

// TestTransportRunReleased: the runs Release writes, as operators read
// them: each transport failure counts on from the last, whether or not its
// cooldown is still live; a success, or a new base URL, ends the run.
func TestTransportRunReleased(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{baseURL: "https://api.example.invalid"})
	fail := func(cause weirv1.TransportCause, text string) {
		t.Helper()
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportCause: cause, TransportError: text})
	}
	run := func() *weirv1.Unreachable {
		t.Helper()
		return e.getAccount(a.Id).Unreachable
	}
	start := e.clock.Now()
	fail(weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "no such host")
	if u := run(); u == nil || u.Attempts != 1 || u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_DNS || u.Host != "api.example.invalid" || !u.Since.AsTime().Equal(start) {
		t.Fatalf("after one failure: %v", u)
	}
	// Past its cooldown, still the run.
	e.clock.Advance(policy.TransportCooldown + time.Second)
	if u := run(); u == nil || u.Attempts != 1 {
		t.Fatalf("the run ended with its cooldown: %v", u)
	}
	for range 13 {
		fail(weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "no such host")
		e.clock.Advance(policy.TransportCooldown + time.Second)
	}
	last := e.clock.Now()
	fail(weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED, "connection refused")
	u := run()
	if u == nil || u.Attempts != 15 || u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED || u.Error != "connection refused" ||
		!u.Since.AsTime().Equal(start) || !u.LastAt.AsTime().Equal(last) {
		t.Fatalf("after 15 failures: %v", u)
	}
	if ev := e.getAccount(a.Id).Cooldown.GetEvidence(); ev != "transport_error, refused: connection refused, 15 attempts since "+start.UTC().Format(time.RFC3339) {
		t.Errorf("cooldown evidence %q", ev)
	}

	// A success ends it; the next failure starts another.
	e.clock.Advance(policy.TransportCooldown + time.Second)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	if u := run(); u != nil {
		t.Fatalf("a success left the run: %v", u)
	}
	e.clock.Advance(time.Second)
	again := e.clock.Now()
	fail(weirv1.TransportCause_TRANSPORT_CAUSE_TIMEOUT, "dial timeout")
	if u := run(); u == nil || u.Attempts != 1 || !u.Since.AsTime().Equal(again) {
		t.Fatalf("after the success, a new run: %v", u)
	}

	// A new base URL voids it, live cooldown and all.
	if _, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: a.Id, BaseUrl: "https://api.example.com", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"base_url"}},
	})); err != nil {
		t.Fatal(err)
	}
	if got := e.getAccount(a.Id); got.Unreachable != nil || got.Cooldown != nil {
		t.Fatalf("a new base URL kept the run %v / cooldown %v", got.Unreachable, got.Cooldown)
	}
}
