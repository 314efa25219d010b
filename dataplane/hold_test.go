package dataplane

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// holdBase is the un-jittered backoff of round n: 0.5 s doubling, capped
// at 20 s.
var holdBase = []time.Duration{
	500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
	20 * time.Second, 20 * time.Second, 20 * time.Second, 20 * time.Second, 20 * time.Second, 20 * time.Second,
	20 * time.Second,
}

func TestHoldBackoff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r    float64
		want func(base time.Duration) time.Duration
	}{
		// r = 0 is the bottom of the jitter: three quarters of the base.
		{0, func(b time.Duration) time.Duration { return b * 3 / 4 }},
		// r = 0.5 is the middle: exactly the base.
		{0.5, func(b time.Duration) time.Duration { return b }},
		// r just under 1 is just under the top: five quarters of the base.
		{0.999, func(b time.Duration) time.Duration { return time.Duration(float64(b) * 1.2495) }},
	} {
		prev := time.Duration(-1)
		for n, base := range holdBase {
			got := holdBackoff(n, tc.r)
			if want := tc.want(base); got != want {
				t.Errorf("holdBackoff(%d, %v) = %v, want %v", n, tc.r, got, want)
			}
			if got < base*3/4 || got >= base*5/4 {
				t.Errorf("holdBackoff(%d, %v) = %v, outside [%v, %v) (±25%% of %v)", n, tc.r, got, base*3/4, base*5/4, base)
			}
			if got <= 0 {
				t.Errorf("holdBackoff(%d, %v) = %v, want positive", n, tc.r, got)
			}
			if got < prev {
				t.Errorf("holdBackoff(%d, %v) = %v < holdBackoff(%d) = %v: not monotone in n", n, tc.r, got, n-1, prev)
			}
			prev = got
		}
	}
	// The cap holds for any round, however late: no shift overflows.
	for _, n := range []int{13, 31, 63, 64, 1000, 1 << 30} {
		if got := holdBackoff(n, 0.5); got != holdBackoffMax {
			t.Errorf("holdBackoff(%d, 0.5) = %v, want the %v cap", n, got, holdBackoffMax)
		}
	}
	// The longest waits land between 15 and 25 s, whatever the jitter.
	for i := range 1000 {
		r := float64(i) / 1000
		if got := holdBackoff(20, r); got < 15*time.Second || got >= 25*time.Second {
			t.Fatalf("holdBackoff(20, %v) = %v, want within [15s, 25s)", r, got)
		}
	}
}

func TestHoldUntil(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 3, 4, 5, 6, 7, 0, time.UTC)
	at := func(d time.Duration) time.Time { return now.Add(d) }
	const s = time.Second
	for _, tc := range []struct {
		name     string
		deadline time.Time
		retryAt  time.Time
		backoff  time.Duration
		want     time.Time // zero when waiting cannot help
		ok       bool
	}{
		{"budget spent exactly", at(0), time.Time{}, s, time.Time{}, false},
		{"budget spent long ago", at(-time.Minute), time.Time{}, s, time.Time{}, false},
		{"budget spent, retry known", at(0), at(2 * s), s, time.Time{}, false},
		{"retry_at beyond the deadline", at(60 * s), at(61 * s), s, time.Time{}, false},
		{"retry_at far beyond, short backoff", at(60 * s), at(time.Hour), time.Millisecond, time.Time{}, false},
		{"retry_at between backoff and deadline", at(60 * s), at(30 * s), s, at(30 * s), true},
		{"retry_at exactly at the deadline", at(60 * s), at(60 * s), s, at(60 * s), true},
		{"retry_at before backoff ends", at(60 * s), at(500 * time.Millisecond), 2 * s, at(500 * time.Millisecond), true},
		{"retry_at sooner than the least wait", at(60 * s), at(time.Millisecond), 2 * s, at(holdMinWait), true},
		{"retry_at exactly at backoff end", at(60 * s), at(2 * s), 2 * s, at(2 * s), true},
		{"backoff beyond the deadline", at(3 * s), time.Time{}, 20 * s, at(3 * s), true},
		{"backoff beyond, retry_at before deadline", at(3 * s), at(2 * s), 20 * s, at(2 * s), true},
		{"zero retry_at", at(60 * s), time.Time{}, 4 * s, at(4 * s), true},
		{"retry_at in the past", at(60 * s), at(-10 * s), 4 * s, at(holdMinWait), true},
		{"retry_at is now", at(60 * s), at(0), 4 * s, at(holdMinWait), true},
		{"least wait beyond the deadline", at(time.Millisecond), at(0), 4 * s, at(time.Millisecond), true},
		{"zero backoff, nothing known", at(60 * s), time.Time{}, 0, at(0), true},
		{"deadline a nanosecond away", at(1), time.Time{}, s, at(1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := holdUntil(now, tc.deadline, tc.retryAt, tc.backoff)
			if ok != tc.ok || !got.Equal(tc.want) {
				t.Errorf("holdUntil(now, now%+v, %v, %v) = (now%+v, %v), want (now%+v, %v)",
					tc.deadline.Sub(now), tc.retryAt, tc.backoff, got.Sub(now), ok, tc.want.Sub(now), tc.ok)
			}
			if !ok && !got.IsZero() {
				t.Errorf("not ok, but returned %v", got)
			}
		})
	}
}

// TestHoldUntilProperties checks holdUntil's contract over random inputs:
// when it says wait, the wait ends within the budget, at a known recovery
// (or holdMinWait from now, if later) or else at the end of the backoff
// (or the deadline, if sooner), and never in the past; it refuses exactly
// when the budget is spent or the recovery lies beyond it.
func TestHoldUntilProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Date(2030, 3, 4, 5, 6, 7, 0, time.UTC)
	span := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	for i := range 200_000 {
		deadline := now.Add(span(-10*time.Second, time.Minute))
		var retryAt time.Time
		if rng.IntN(4) > 0 {
			retryAt = now.Add(span(-30*time.Second, 90*time.Second))
		}
		backoff := holdBackoff(rng.IntN(15), rng.Float64())
		if rng.IntN(10) == 0 {
			backoff = span(0, time.Minute)
		}
		until, ok := holdUntil(now, deadline, retryAt, backoff)
		wantOK := now.Before(deadline) && (retryAt.IsZero() || !retryAt.After(deadline))
		if ok != wantOK {
			t.Fatalf("case %d: holdUntil(now, now%+v, retry %v, %v) ok = %v, want %v",
				i, deadline.Sub(now), retryAt, backoff, ok, wantOK)
		}
		if !ok {
			continue
		}
		want := now.Add(backoff)
		if !retryAt.IsZero() {
			want = maxTime(retryAt, now.Add(holdMinWait))
		}
		if deadline.Before(want) {
			want = deadline
		}
		switch {
		case until.After(deadline):
			t.Fatalf("case %d: waits until now%+v, after the deadline now%+v", i, until.Sub(now), deadline.Sub(now))
		case !until.Equal(want):
			t.Fatalf("case %d: waits until now%+v, want now%+v (retry_at %v, backoff %v, deadline now%+v)", i, until.Sub(now), want.Sub(now), retryAt, backoff, deadline.Sub(now))
		case until.Before(now):
			t.Fatalf("case %d: waits until the past", i)
		}
	}
}

// TestAddRecordBounded: a request held through a long storm keeps the
// first records, the latest, and one that counts what was left out between
// them, within the control plane's limit.
func TestAddRecordBounded(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, maxRouteRecords - 1, maxRouteRecords, maxRouteRecords + 1, 3*maxRouteRecords + 7} {
		rt := &routing{rec: &weirv1.RouteEvent{}}
		for i := range n {
			rt.addRecord(&weirv1.AttemptRecord{At: durationpb.New(time.Duration(i) * time.Second), Status: int32(i)})
		}
		recs := rt.rec.AttemptRecords
		if n <= maxRouteRecords {
			if len(recs) != n || rt.omitted != 0 {
				t.Fatalf("%d records: kept %d, omitted %d", n, len(recs), rt.omitted)
			}
			continue
		}
		if len(recs) != maxRouteRecords {
			t.Fatalf("%d records: kept %d, want %d", n, len(recs), maxRouteRecords)
		}
		for i := range keepHeadRecords {
			if recs[i].Status != int32(i) {
				t.Fatalf("%d records: head %d is record %d", n, i, recs[i].Status)
			}
		}
		omitted := n - (maxRouteRecords - 1)
		marker := recs[keepHeadRecords]
		if want := strconv.Itoa(omitted) + " attempt and hold records left out"; marker.HoldReason != want || marker.Status != 0 ||
			marker.At.AsDuration() != time.Duration(keepHeadRecords)*time.Second {
			t.Fatalf("%d records: marker %v, want %q at the first left out", n, marker, want)
		}
		for i, r := range recs[keepHeadRecords+1:] {
			if want := int32(n - (maxRouteRecords - keepHeadRecords - 1) + i); r.Status != want {
				t.Fatalf("%d records: tail %d is record %d, want %d", n, i, r.Status, want)
			}
		}
	}
}

// TestUnreachableJudge: the verdict on a pool after each round. It holds
// only while every attempt of the round was a transport error and the
// control plane said the rest of the pool cools on one; its start is the
// round that first showed it; an account that answers ends it.
func TestUnreachableJudge(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 3, 4, 5, 6, 7, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	dns := &weirv1.Unreachable{Cause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS, Error: "no such host", Host: "api.example.invalid"}
	refused := &weirv1.Unreachable{Cause: weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED, Error: "connection refused"}
	unreachable := func(u *weirv1.Unreachable) *weirv1.NoAccount {
		return &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED, Unreachable: u}
	}
	cooling := &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING}
	was := unreachableState{since: at(-time.Minute), run: refused}
	for _, tc := range []struct {
		name                string
		prior               unreachableState
		attempts, transport int
		none                *weirv1.NoAccount
		want                unreachableState
	}{
		{"first round, every attempt transport", unreachableState{}, 2, 2, unreachable(dns), unreachableState{since: t0, run: dns}},
		{"no attempt, the control plane's word alone", unreachableState{}, 0, 0, unreachable(dns), unreachableState{since: t0, run: dns}},
		{"a later round keeps the start, names the latest run", was, 1, 1, unreachable(dns), unreachableState{since: at(-time.Minute), run: dns}},
		{"one attempt answered (a 529, a 429)", unreachableState{}, 2, 1, unreachable(dns), unreachableState{}},
		{"an answer ends it", was, 1, 0, nil, unreachableState{}},
		{"an answer ends it, whatever the control plane says", was, 3, 2, unreachable(dns), unreachableState{}},
		{"the rest of the pool cools otherwise", unreachableState{}, 1, 1, cooling, unreachableState{}},
		{"the rest of the pool cools otherwise, later", was, 1, 1, cooling, unreachableState{}},
		{"mid-round, transport so far: as it was", was, 2, 2, nil, was},
		{"the attempt cap, transport only: as it was", was, 5, 5, nil, was},
		{"mid-round, not unreachable yet: still not", unreachableState{}, 1, 1, nil, unreachableState{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.prior.judge(t0, tc.attempts, tc.transport, tc.none)
			if !got.since.Equal(tc.want.since) || got.run != tc.want.run {
				t.Errorf("judge = since %v run %v, want since %v run %v", got.since, got.run, tc.want.since, tc.want.run)
			}
		})
	}
}

// TestUnreachableHoldEnd: an unreachable pool holds for the unreachable
// hold from when it was first seen so, never past the capacity hold; only
// when that short budget is what ends the holds (cut) is the answer
// weir's 503.
func TestUnreachableHoldEnd(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 3, 4, 5, 6, 7, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	run := &weirv1.Unreachable{}
	for _, tc := range []struct {
		name        string
		u           unreachableState
		capacityEnd time.Time
		hold        time.Duration
		want        time.Time
		cut         bool
	}{
		{"reachable: the capacity hold", unreachableState{}, at(20 * time.Minute), 30 * time.Second, at(20 * time.Minute), false},
		{"unreachable from the start", unreachableState{since: t0, run: run}, at(20 * time.Minute), 30 * time.Second, at(30 * time.Second), true},
		{"unreachable after a storm", unreachableState{since: at(5 * time.Minute), run: run}, at(20 * time.Minute), 30 * time.Second, at(5*time.Minute + 30*time.Second), true},
		{"the capacity hold is shorter", unreachableState{since: t0, run: run}, at(10 * time.Second), 30 * time.Second, at(10 * time.Second), false},
		{"both end together", unreachableState{since: t0, run: run}, at(30 * time.Second), 30 * time.Second, at(30 * time.Second), false},
		{"unreachable near the end", unreachableState{since: at(19*time.Minute + 50*time.Second), run: run}, at(20 * time.Minute), 30 * time.Second, at(20 * time.Minute), false},
		{"unreachable_hold 0 answers at once", unreachableState{since: t0, run: run}, at(20 * time.Minute), 0, t0, true},
		{"capacity_hold 0 fails fast as before", unreachableState{since: t0, run: run}, t0, 30 * time.Second, t0, false},
	} {
		if got := tc.u.holdEnd(tc.capacityEnd, tc.hold); !got.Equal(tc.want) {
			t.Errorf("%s: holdEnd = now%+v, want now%+v", tc.name, got.Sub(t0), tc.want.Sub(t0))
		}
		if got := tc.u.cut(tc.capacityEnd, tc.hold); got != tc.cut {
			t.Errorf("%s: cut = %v, want %v", tc.name, got, tc.cut)
		}
	}
}

// TestErrUnreachable: the answer names the cause and the host, in the
// client's wire format: 503, X-Should-Retry false, no Retry-After.
func TestErrUnreachable(t *testing.T) {
	t.Parallel()
	u := &weirv1.Unreachable{Cause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS, Error: "no such host", Host: "api.example.invalid"}
	const want = "every account's upstream is unreachable: dns: no such host for api.example.invalid"
	if got := unreachableMessage(u); got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	if got := unreachableMessage(&weirv1.Unreachable{Cause: weirv1.TransportCause_TRANSPORT_CAUSE_TLS}); got != "every account's upstream is unreachable: tls" {
		t.Errorf("without text or host: %q", got)
	}
	proxy := &weirv1.Unreachable{Cause: weirv1.TransportCause_TRANSPORT_CAUSE_PROXY, Host: "api.anthropic.com",
		Error: "egress proxy socks5://10.0.0.7:1080 could not be reached (connection refused)"}
	if got := unreachableMessage(proxy); got != "every account's upstream is unreachable: egress proxy socks5://10.0.0.7:1080 could not be reached (connection refused) for api.anthropic.com" {
		t.Errorf("a proxy's failure: %q", got)
	}
	for _, tc := range []struct {
		wire wire
		body string
	}{
		{wireAnthropic, `{"error":{"message":"weir: ` + want + `","type":"api_error"},"request_id":"req_1","type":"error"}`},
		{wireOpenAI, `{"error":{"code":null,"message":"weir: ` + want + `","param":null,"type":"server_error"}}`},
	} {
		rec := httptest.NewRecorder()
		writeError(rec, tc.wire, "req_1", errUnreachable(u))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("X-Should-Retry") != "false" || rec.Header().Get("Retry-After") != "" {
			t.Errorf("wire %d: status %d, headers %v", tc.wire, rec.Code, rec.Header())
		}
		if got := rec.Body.String(); got != tc.body {
			t.Errorf("wire %d: body %s, want %s", tc.wire, got, tc.body)
		}
	}
}
