package policy

import (
	"encoding/json"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestLadderRungsOneAndFour(t *testing.T) {
	t.Parallel()
	week := epoch.Add(30 * time.Hour)
	spent := []Claim{{Claim: "7d", Minutes: 10080, Reset: week.Unix()}}
	for _, tc := range []struct {
		name   string
		in     ladderInput
		rung   Rung
		reason weirv1.CooldownReason
		until  time.Time
	}{
		{"cached exhaustion outranks a burst", ladderInput{headers: hdr("retry-after", "3"), oauth: true, spent: spent},
			rungCachedQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, week},
		{"cached exhaustion outranks a scoped claim", ladderInput{headers: hdr("7d_oi-status", "rejected", "7d_oi-reset", at(90*time.Hour)), oauth: true, family: "opus", spent: spent},
			rungCachedQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, week},
		{"a live claim outranks the cache", ladderInput{headers: hdr("5h-status", "rejected", "5h-reset", at(2*time.Hour)), oauth: true, spent: spent},
			rungAccountQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, epoch.Add(2 * time.Hour)},
		{"the latest spent reset", ladderInput{headers: nil, spent: append([]Claim{{Claim: "5h", Minutes: 300, Reset: epoch.Add(time.Hour).Unix()}}, spent...)},
			rungCachedQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, week},
		{"a probe's transient failure re-cools briefly", ladderInput{headers: hdr("retry-after", "600", "status", "allowed", "5h-status", "allowed", "5h-utilization", "0.2"), oauth: true, recoveryProbe: true},
			rungRecovery, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, epoch.Add(RecoveryReprobe)},
		{"a probe that meets a rejection is no re-probe", ladderInput{headers: hdr("status", "rejected", "7d-status", "rejected", "7d-reset", at(50*time.Hour)), oauth: true, recoveryProbe: true},
			rungAccountQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, epoch.Add(50 * time.Hour)},
		{"out of credits outranks the cache", ladderInput{headers: hdr("status", "rejected", "overage-disabled-reason", "out_of_credits"), spent: spent},
			rungOutOfCredits, weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS, epoch.Add(OutOfCreditsFloor)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.now = epoch
			d := ladder(tc.in)
			if d.rung != tc.rung || d.reason != tc.reason || !d.until.Equal(tc.until) || d.action != weirv1.Action_ACTION_FAILOVER {
				t.Errorf("rung %s %v until %v action %v, want %s %v until %v", d.rung, d.reason, d.until, d.action, tc.rung, tc.reason, tc.until)
			}
		})
	}
}

func TestRecoveredReading(t *testing.T) {
	t.Parallel()
	f := func(v float64) *float64 { return &v }
	ts := func(d time.Duration) *time.Time { x := epoch.Add(d); return &x }
	ev := func(claims ...Claim) []byte {
		b, _ := json.Marshal(Evidence{Class: "OUTCOME_CLASS_RATE_LIMITED", Claims: claims})
		return b
	}
	weekClaim := Claim{Claim: "7d", Minutes: 10080, Reset: epoch.Add(2 * time.Hour).Unix()}
	fiveClaim := Claim{Claim: "5h", Minutes: 300, Reset: epoch.Add(time.Hour).Unix()}
	newWeek := Reading{Window: windowSevenDay, Utilization: f(0.1), ResetsAt: ts(170 * time.Hour)}
	for _, tc := range []struct {
		name     string
		evidence []byte
		readings []Reading
		want     bool
	}{
		{"the rejected week rolled over", ev(weekClaim), []Reading{newWeek}, true},
		{"the same week, whatever it reads", ev(weekClaim), []Reading{{Window: windowSevenDay, Utilization: f(0.1), ResetsAt: ts(2 * time.Hour)}}, false},
		{"a new week, still spent", ev(weekClaim), []Reading{{Window: windowSevenDay, Utilization: f(0.99), ResetsAt: ts(170 * time.Hour)}}, false},
		{"no utilization is no evidence", ev(weekClaim), []Reading{{Window: windowSevenDay, ResetsAt: ts(170 * time.Hour)}}, false},
		{"both claims must recover", ev(fiveClaim, weekClaim), []Reading{newWeek}, false},
		{"both recovered", ev(fiveClaim, weekClaim), []Reading{{Window: windowFiveHour, Utilization: f(0), ResetsAt: ts(6 * time.Hour)}, newWeek}, true},
		{"a scoped claim is not the account's", ev(Claim{Claim: "7d_oi", Reset: epoch.Add(time.Hour).Unix()}), []Reading{newWeek}, true},
		{"no claims: every window read must have room", ev(), []Reading{newWeek, {Window: windowFiveHour, Utilization: f(0.995), ResetsAt: ts(time.Hour)}}, false},
		{"no claims, nothing read", ev(), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cd := Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, Evidence: tc.evidence}
			if got := Recovered(cd, tc.readings, epoch, false); got != tc.want {
				t.Errorf("recovered = %v, want %v", got, tc.want)
			}
		})
	}
}
