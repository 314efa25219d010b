package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/internal/pgtest"
)

// fakeCreds is the control plane's credential check, answering labels.
type fakeCreds struct {
	labels []string
	err    error
}

func (f fakeCreds) CheckCredentials(context.Context) ([]string, error) { return f.labels, f.err }

// integrityFixture is a database, a clock the test moves, and a checker.
type integrityFixture struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	logs    *lockedBuffer
	mu      sync.Mutex
	clock   time.Time
	counted map[string]int // kind/action → total through the metrics hook
	checker *IntegrityChecker
}

func setupIntegrity(t *testing.T, creds CredentialChecker) *integrityFixture {
	t.Helper()
	pool := pgtest.NewPool(t)
	f := &integrityFixture{pool: pool, q: db.New(pool), logs: &lockedBuffer{}, clock: now, counted: map[string]int{}}
	aliveAt(t, pool, now)
	f.checker = &IntegrityChecker{deps: Deps{
		Queries:    f.q,
		Logger:     slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), f.logs), nil)),
		Now:        f.now,
		LeaseGrace: 10 * time.Minute,
		LeaseTTL:   30 * time.Second,
		SessionTTL: time.Hour,
		Creds:      creds,
		Findings: func(kind, action string, n int) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.counted[kind+"/"+action] += n
		},
	}}
	return f
}

func (f *integrityFixture) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clock
}

func (f *integrityFixture) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock = f.clock.Add(d)
}

func (f *integrityFixture) account(t *testing.T, label string) uuid.UUID {
	t.Helper()
	id := uuid.New()
	if _, err := f.q.CreateAccount(t.Context(), db.CreateAccountParams{
		ID: id, Provider: "anthropic", AuthKind: "oauth", Label: label,
		MaxConcurrency: 10, CredentialSealed: []byte{1}, CredentialHint: "…****", Now: now.Add(-30 * 24 * time.Hour),
	}); err != nil {
		t.Fatalf("create account %s: %v", label, err)
	}
	return id
}

func (f *integrityFixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (f *integrityFixture) cooldown(t *testing.T, account uuid.UUID, until time.Time, evidence string) {
	t.Helper()
	f.exec(t, `INSERT INTO cooldowns (account_id, reason, transient, until, written_at, evidence)
		VALUES ($1, 'quota_exhausted', false, $2, $3, $4::jsonb)`, account, until, now.Add(-time.Hour), evidence)
}

func (f *integrityFixture) claim(t *testing.T, account uuid.UUID, at time.Time, ttl time.Duration) uuid.UUID {
	t.Helper()
	row, err := f.q.ClaimLease(t.Context(), db.ClaimLeaseParams{
		AccountID: account, Revision: 1, RequestID: "r", Model: "m", Now: at, ExpiresAt: at.Add(ttl),
	})
	if err != nil || row.LeaseID == uuid.Nil {
		t.Fatalf("claim at %v: %v (id %v)", at, err, row.LeaseID)
	}
	return row.LeaseID
}

func (f *integrityFixture) run(t *testing.T) map[string]Finding {
	t.Helper()
	job := &river.Job[IntegrityArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: IntegrityArgs{}.Kind()}, Args: IntegrityArgs{}}
	if err := f.checker.Work(t.Context(), job); err != nil {
		t.Fatalf("Work: %v", err)
	}
	// The stored report is what the run found.
	var ranAt time.Time
	var body []byte
	if err := f.pool.QueryRow(t.Context(), `SELECT ran_at, findings FROM integrity_reports ORDER BY id DESC LIMIT 1`).Scan(&ranAt, &body); err != nil {
		t.Fatalf("last report: %v", err)
	}
	if !ranAt.Equal(f.now()) {
		t.Errorf("report ran_at %v, want the injected clock %v", ranAt, f.now())
	}
	var list []Finding
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("report %s: %v", body, err)
	}
	out := map[string]Finding{}
	for _, fd := range list {
		out[fd.Kind] = fd
	}
	return out
}

func (f *integrityFixture) scalar(t *testing.T, sql string, args ...any) any {
	t.Helper()
	var v any
	if err := f.pool.QueryRow(t.Context(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func wantCounts(t *testing.T, run string, got map[string]Finding, want map[string]int64) {
	t.Helper()
	for kind, n := range want {
		fd, ok := got[kind]
		if !ok {
			t.Errorf("%s: no %s finding in the report", run, kind)
			continue
		}
		if fd.Count != n {
			t.Errorf("%s: %s count %d, want %d", run, kind, fd.Count, n)
		}
	}
}

// TestIntegrityCheck seeds every anomaly the check knows, runs it, and
// checks what it repaired, what it only reported, that a repair never
// shortens a cooldown, and that a second run has nothing left to repair.
func TestIntegrityCheck(t *testing.T) {
	t.Parallel()
	f := setupIntegrity(t, fakeCreds{labels: []string{"rekeyed"}})
	ctx := t.Context()

	// Cooldowns without evidence, live and expired; and one with evidence.
	live := now.Add(3 * time.Hour)
	noEvidence := map[string]uuid.UUID{}
	for label, ev := range map[string]string{
		"ev-empty": `{}`, "ev-array": `[]`, "ev-null": `null`, "ev-noclass": `{"status":429}`, "ev-blankclass": `{"class":""}`,
	} {
		id := f.account(t, label)
		f.cooldown(t, id, live, ev)
		noEvidence[label] = id
	}
	expiredNoEv := f.account(t, "ev-expired")
	f.cooldown(t, expiredNoEv, now.Add(-time.Hour), `{}`)
	good := f.account(t, "ev-good")
	f.cooldown(t, good, live, `{"class":"OUTCOME_CLASS_RATE_LIMITED","status":429}`)

	// Leases: long past the reaper's grace, within it, and live.
	leased := f.account(t, "leased")
	stale := f.claim(t, leased, now.Add(-3*time.Hour), 30*time.Second)
	inGrace := f.claim(t, leased, now.Add(-5*time.Minute), 30*time.Second)
	liveLease := f.claim(t, leased, now.Add(-10*time.Second), time.Minute)

	// Refresh claims: abandoned 6 minutes ago, ended 2 minutes ago, running.
	stuckRefresh := f.account(t, "refresh-stuck")
	f.exec(t, `UPDATE accounts SET refreshing_until = $2 WHERE id = $1`, stuckRefresh, now.Add(-6*time.Minute))
	recentRefresh := f.account(t, "refresh-recent")
	f.exec(t, `UPDATE accounts SET refreshing_until = $2 WHERE id = $1`, recentRefresh, now.Add(-2*time.Minute))
	runningRefresh := f.account(t, "refresh-running")
	f.exec(t, `UPDATE accounts SET refreshing_until = $2 WHERE id = $1`, runningRefresh, now.Add(30*time.Second))

	// Recovery probes: idle for 11 minutes; newly idle; in flight; behind
	// a live cooldown.
	probe := func(label string) uuid.UUID {
		id := f.account(t, label)
		f.exec(t, `UPDATE accounts SET recovery_probe = true WHERE id = $1`, id)
		return id
	}
	probeStuck := probe("probe-stuck")
	f.exec(t, `UPDATE accounts SET recovery_probe_seen_at = $2 WHERE id = $1`, probeStuck, now.Add(-11*time.Minute))
	probeNew := probe("probe-new")
	probeBusy := probe("probe-busy")
	f.claim(t, probeBusy, now.Add(-10*time.Second), time.Minute)
	f.exec(t, `UPDATE accounts SET recovery_probe_seen_at = $2 WHERE id = $1`, probeBusy, now.Add(-time.Hour))
	probeCooling := probe("probe-cooling")
	f.cooldown(t, probeCooling, live, `{"class":"OUTCOME_CLASS_RATE_LIMITED"}`)
	// Leased 5 minutes ago (the lease is over): still probing, not stuck.
	probeUsed := probe("probe-used")
	f.exec(t, `UPDATE accounts SET recovery_probe_seen_at = $2 WHERE id = $1`, probeUsed, now.Add(-11*time.Minute))
	f.claim(t, probeUsed, now.Add(-5*time.Minute), 30*time.Second)

	// Housekeeping: a cooldown and a gate expired 8 days ago, a gate 6.
	old := f.account(t, "old")
	f.cooldown(t, old, now.Add(-8*24*time.Hour), `{"class":"x"}`)
	for fam, until := range map[string]time.Time{"opus": now.Add(-8 * 24 * time.Hour), "sonnet": now.Add(-6 * 24 * time.Hour)} {
		if _, err := f.q.WriteFamilyGate(ctx, db.WriteFamilyGateParams{
			AccountID: old, Family: fam, Until: until, Now: until.Add(-time.Hour), Evidence: []byte(`{"class":"x"}`),
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Broken: reported with its reason, never repaired.
	broken := f.account(t, "broken")
	f.exec(t, `UPDATE accounts SET broken_at = $2, broken_reason = 'token endpoint rejected the refresh token (invalid_grant)' WHERE id = $1`, broken, now.Add(-time.Hour))

	got := f.run(t)
	wantCounts(t, "first run", got, map[string]int64{
		FindingCooldownWithoutEvidence: 6,
		FindingStaleLease:              1,
		FindingStuckRefresh:            1,
		FindingStuckRecoveryProbe:      1,
		FindingExpiredCooldown:         1,
		FindingExpiredFamilyGate:       1,
		FindingBrokenAccount:           1,
		FindingUnreadableCredential:    1,
	})
	for kind, action := range map[string]string{
		FindingCooldownWithoutEvidence: ActionRepaired, FindingStaleLease: ActionRepaired,
		FindingBrokenAccount: ActionReported, FindingUnreadableCredential: ActionReported,
	} {
		if got[kind].Action != action {
			t.Errorf("%s action %q, want %q", kind, got[kind].Action, action)
		}
	}
	if b := got[FindingBrokenAccount]; len(b.Accounts) != 1 || b.Accounts[0].Label != "broken" || !strings.Contains(b.Accounts[0].Reason, "invalid_grant") {
		t.Errorf("broken finding %+v, want the label and its reason", b)
	}
	if u := got[FindingUnreadableCredential]; len(u.Accounts) != 1 || u.Accounts[0].Label != "rekeyed" {
		t.Errorf("unreadable finding %+v", u)
	}

	// Evidence repaired, deadlines and reasons untouched.
	for label, id := range noEvidence {
		var until time.Time
		var reason string
		var ev []byte
		if err := f.pool.QueryRow(ctx, `SELECT until, reason, evidence FROM cooldowns WHERE account_id = $1`, id).Scan(&until, &reason, &ev); err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if !until.Equal(live) || reason != "quota_exhausted" {
			t.Errorf("%s: cooldown now %s until %v, want quota_exhausted until %v", label, reason, until, live)
		}
		var e map[string]string
		if err := json.Unmarshal(ev, &e); err != nil || e["class"] != "unknown" || e["repaired_by"] != "integrity" {
			t.Errorf("%s: evidence %s, want the repaired marker", label, ev)
		}
	}
	if ev := f.scalar(t, `SELECT evidence->>'status' FROM cooldowns WHERE account_id = $1`, good); ev != "429" {
		t.Errorf("good cooldown's evidence changed: status %v", ev)
	}

	// Leases: only the stale one went.
	for name, tc := range map[string]struct {
		id   uuid.UUID
		kept bool
	}{"stale": {stale, false}, "in grace": {inGrace, true}, "live": {liveLease, true}} {
		n := f.scalar(t, `SELECT count(*) FROM leases WHERE id = $1`, tc.id).(int64)
		if (n == 1) != tc.kept {
			t.Errorf("lease %s: present %v, want %v", name, n == 1, tc.kept)
		}
	}

	// Refresh claims.
	for name, tc := range map[string]struct {
		id      uuid.UUID
		cleared bool
	}{"stuck": {stuckRefresh, true}, "recent": {recentRefresh, false}, "running": {runningRefresh, false}} {
		v := f.scalar(t, `SELECT refreshing_until FROM accounts WHERE id = $1`, tc.id)
		if (v == nil) != tc.cleared {
			t.Errorf("refresh %s: refreshing_until %v, cleared want %v", name, v, tc.cleared)
		}
	}

	// Probes: the stuck one cleared; the others still pending.
	for name, tc := range map[string]struct {
		id      uuid.UUID
		pending bool
	}{"stuck": {probeStuck, false}, "new": {probeNew, true}, "busy": {probeBusy, true}, "cooling": {probeCooling, true}, "used": {probeUsed, true}} {
		if v := f.scalar(t, `SELECT recovery_probe FROM accounts WHERE id = $1`, tc.id); v != tc.pending {
			t.Errorf("probe %s: recovery_probe %v, want %v", name, v, tc.pending)
		}
	}
	if v := f.scalar(t, `SELECT recovery_probe_seen_at FROM accounts WHERE id = $1`, probeBusy); v != nil {
		t.Errorf("busy probe keeps its idle clock %v", v)
	}
	if v, ok := f.scalar(t, `SELECT recovery_probe_seen_at FROM accounts WHERE id = $1`, probeUsed).(time.Time); !ok || !v.Equal(now) {
		t.Errorf("used probe's idle clock %v, want restarted at %v", v, now)
	}

	// Housekeeping.
	if n := f.scalar(t, `SELECT count(*) FROM cooldowns WHERE account_id = $1`, old).(int64); n != 0 {
		t.Errorf("8-day-old cooldown kept")
	}
	if v := f.scalar(t, `SELECT string_agg(family, ',') FROM family_gates WHERE account_id = $1`, old); v != "sonnet" {
		t.Errorf("family gates left %v, want sonnet only", v)
	}
	// Broken stays broken.
	if v := f.scalar(t, `SELECT broken_at IS NOT NULL FROM accounts WHERE id = $1`, broken); v != true {
		t.Errorf("broken account mended by the integrity check")
	}

	// Metrics and logs, one line per kind found, no zero-count lines.
	f.mu.Lock()
	if f.counted["cooldown_without_evidence/repaired"] != 6 || f.counted["broken_account/reported"] != 1 || f.counted["unreadable_credential/reported"] != 1 {
		t.Errorf("metrics hook counted %v", f.counted)
	}
	f.mu.Unlock()
	logs := f.logs.String()
	for _, want := range []string{
		`msg="integrity finding" kind=cooldown_without_evidence action=repaired count=6`,
		`kind=broken_account action=reported count=1 accounts=[broken]`,
		`kind=unreadable_credential action=reported count=1 accounts=[rekeyed]`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "kind=stale_lease action=repaired count=0") || strings.Contains(logs, "invalid_grant") {
		t.Errorf("logs carry a zero count or a reason:\n%s", logs)
	}

	// Idempotent: a second run has nothing to repair and reports the same.
	again := f.run(t)
	wantCounts(t, "second run", again, map[string]int64{
		FindingCooldownWithoutEvidence: 0, FindingStaleLease: 0, FindingStuckRefresh: 0,
		FindingStuckRecoveryProbe: 0, FindingExpiredCooldown: 0, FindingExpiredFamilyGate: 0,
		FindingBrokenAccount: 1, FindingUnreadableCredential: 1,
	})

	// The newly idle probe is stuck once 10 minutes pass with nothing on it.
	f.advance(stuckProbeAfter + time.Second)
	later := f.run(t)
	if later[FindingStuckRecoveryProbe].Count != 2 {
		t.Errorf("after 10 idle minutes: stuck probes %d, want 2 (probe-new, probe-used)", later[FindingStuckRecoveryProbe].Count)
	}
	if v := f.scalar(t, `SELECT recovery_probe FROM accounts WHERE id = $1`, probeNew); v != false {
		t.Errorf("probe-new still pending after 10 idle minutes")
	}
	// The live cooldown behind which a probe waits is never touched, and
	// that probe is not stuck.
	if v := f.scalar(t, `SELECT recovery_probe FROM accounts WHERE id = $1`, probeCooling); v != true {
		t.Errorf("probe behind a live cooldown cleared")
	}
	if v := f.scalar(t, `SELECT until FROM cooldowns WHERE account_id = $1`, probeCooling).(time.Time); !v.Equal(live) {
		t.Errorf("live cooldown moved to %v", v)
	}
}

func TestIntegrityArgs(t *testing.T) {
	t.Parallel()
	if (IntegrityArgs{}).Kind() != "integrity_check" {
		t.Errorf("kind %q", IntegrityArgs{}.Kind())
	}
	if opts := (IntegrityArgs{}).InsertOpts(); !opts.UniqueOpts.ByArgs || opts.UniqueOpts.ByPeriod != IntegrityInterval {
		t.Errorf("insert opts %+v: one check per interval", opts.UniqueOpts)
	}
}

// TestIntegrityProbeMarkResets: a probe that goes and comes back starts
// its idle clock again; a new mark never inherits an old age.
func TestIntegrityProbeMarkResets(t *testing.T) {
	t.Parallel()
	f := setupIntegrity(t, nil)
	id := f.account(t, "probe")
	f.exec(t, `UPDATE accounts SET recovery_probe = true WHERE id = $1`, id)
	f.exec(t, `UPDATE accounts SET recovery_probe_seen_at = $2 WHERE id = $1`, id, now.Add(-time.Hour))
	// A success clears it, a new recovery sets it again.
	f.exec(t, `UPDATE accounts SET recovery_probe = false WHERE id = $1`, id)
	f.exec(t, `UPDATE accounts SET recovery_probe = true WHERE id = $1`, id)
	if got := f.run(t); got[FindingStuckRecoveryProbe].Count != 0 {
		t.Fatalf("a fresh probe mark counted as stuck")
	}
	if _, ok := f.run(t)[FindingUnreadableCredential]; ok {
		t.Errorf("credential finding without a checker")
	}
}

// TestIntegrityKeepsLastReports: integrity_reports keeps the last 100.
func TestIntegrityKeepsLastReports(t *testing.T) {
	t.Parallel()
	f := setupIntegrity(t, nil)
	f.exec(t, `INSERT INTO integrity_reports (ran_at, findings) SELECT $1::timestamptz - g * interval '5 minutes', '[]' FROM generate_series(1, 120) g`, now)
	f.run(t)
	if n := f.scalar(t, `SELECT count(*) FROM integrity_reports`).(int64); n != 100 {
		t.Errorf("%d reports kept, want 100", n)
	}
	if v := f.scalar(t, `SELECT max(ran_at) FROM integrity_reports`).(time.Time); !v.Equal(now) {
		t.Errorf("newest report %v, want this run's", v)
	}
}

// TestIntegrityCheckFails: a failing credential check fails the run (River
// retries it) and stores no partial report.
func TestIntegrityCheckFails(t *testing.T) {
	t.Parallel()
	f := setupIntegrity(t, fakeCreds{err: errors.New("boom")})
	job := &river.Job[IntegrityArgs]{JobRow: &rivertype.JobRow{ID: 1}, Args: IntegrityArgs{}}
	if err := f.checker.Work(t.Context(), job); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Work = %v, want the checker's error", err)
	}
	if n := f.scalar(t, `SELECT count(*) FROM integrity_reports`).(int64); n != 0 {
		t.Errorf("%d reports stored by a failed run", n)
	}
}

// TestIntegrityReportsReplicaMarks: the unreadable_credential finding
// names, besides what this replica's keys cannot open, the accounts
// another replica marked broken for an unreadable credential (every
// replica checks with its own keys), each once, by label.
func TestIntegrityReportsReplicaMarks(t *testing.T) {
	t.Parallel()
	f := setupIntegrity(t, fakeCreds{labels: []string{"both", "here"}})
	mark := func(label, reason string) {
		f.exec(t, `UPDATE accounts SET broken_at = $2, broken_reason = $3 WHERE id = $1`, f.account(t, label), now, reason)
	}
	f.account(t, "here")
	mark("both", "unreadable_credential: sealed elsewhere")
	mark("elsewhere", "unreadable_credential: sealed elsewhere")
	mark("rejected", "credential rejected by the upstream")

	u := f.run(t)[FindingUnreadableCredential]
	var got []string
	for _, a := range u.Accounts {
		got = append(got, a.Label+": "+a.Reason)
	}
	want := []string{
		"both: sealed credential does not open with the current secret key",
		"elsewhere: marked broken by a control plane whose secret keys do not open it",
		"here: sealed credential does not open with the current secret key",
	}
	if u.Count != 3 || !slices.Equal(got, want) {
		t.Errorf("unreadable finding: count %d, %q; want %q", u.Count, got, want)
	}
}
