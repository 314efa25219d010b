package controlplane

import (
	"math"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// ListAccounts and GetAccount carry each window's forecast from the
// snapshots of its current period.
func TestAccountForecasts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	now := e.clock.Now()
	burning, _ := e.createAccount(acct{label: "burning"})
	idle, _ := e.createAccount(acct{label: "idle"})
	bare, _ := e.createAccount(acct{label: "bare"})
	weeklyReset := now.Add(3 * 24 * time.Hour)
	fiveReset := now.Add(2 * time.Hour)
	snap := func(id, window string, at time.Time, u float64, reset time.Time) {
		t.Helper()
		if _, err := e.pool.Exec(t.Context(), `INSERT INTO usage_snapshots (account_id, window_name, utilization, resets_at, taken_at) VALUES ($1, $2, $3, $4, $5)`,
			id, window, u, reset, at); err != nil {
			t.Fatal(err)
		}
	}
	// burning: weekly 0.40 → 0.46 over the last 3 h (0.02/h: 27 h left);
	// five-hour 0.5 → 0.8 over the last hour (0.3/h, would be full in
	// 40 min, before its reset). An older weekly period burned faster.
	for i := 0; i <= 90; i++ {
		at := now.Add(-3*time.Hour + time.Duration(i)*2*time.Minute)
		snap(burning.Id, windowSevenDay, at, 0.40+0.02*at.Sub(now.Add(-3*time.Hour)).Hours(), weeklyReset)
	}
	for i := 0; i <= 30; i++ {
		at := now.Add(-5*time.Hour + time.Duration(i)*2*time.Minute)
		snap(burning.Id, windowSevenDay, at, 0.1+0.5*at.Sub(now.Add(-5*time.Hour)).Hours(), now.Add(-4*time.Hour))
	}
	for i := 0; i <= 30; i++ {
		at := now.Add(-time.Hour + time.Duration(i)*2*time.Minute)
		snap(burning.Id, windowFiveHour, at, 0.5+0.3*at.Sub(now.Add(-time.Hour)).Hours(), fiveReset)
	}
	// idle: flat weekly, and a five-hour window that has already reset.
	for i := 0; i <= 30; i++ {
		at := now.Add(-time.Hour + time.Duration(i)*2*time.Minute)
		snap(idle.Id, windowSevenDay, at, 0.3, weeklyReset)
		snap(idle.Id, windowFiveHour, at, 0.1, now.Add(-time.Minute))
	}
	// Outside the history read: ignored.
	snap(bare.Id, windowSevenDay, now.Add(-7*time.Hour), 0.1, weeklyReset)
	snap(bare.Id, windowSevenDay, now.Add(-6*time.Hour-time.Minute), 0.5, weeklyReset)

	byWindow := func(a *weirv1.Account) map[string]*weirv1.Forecast {
		m := map[string]*weirv1.Forecast{}
		for _, f := range a.GetForecasts() {
			m[f.Window] = f
		}
		return m
	}
	check := func(t *testing.T, accts map[string]*weirv1.Account) {
		t.Helper()
		b := byWindow(accts["burning"])
		if f := b[windowSevenDay]; f == nil || math.Abs(f.BurnPerHour-0.02) > 1e-6 || f.ExhaustsAt == nil || f.ExhaustsAt.AsTime().Sub(now.Add(27*time.Hour)).Abs() > time.Minute {
			t.Errorf("burning weekly forecast %v, want 0.02/h exhausting in 27h", f)
		}
		if f := b[windowFiveHour]; f == nil || math.Abs(f.BurnPerHour-0.3) > 1e-6 || f.ExhaustsAt == nil || f.ExhaustsAt.AsTime().Sub(now.Add(40*time.Minute)).Abs() > time.Minute {
			t.Errorf("burning five-hour forecast %v, want 0.3/h exhausting in 40m", f)
		}
		i := byWindow(accts["idle"])
		if f := i[windowSevenDay]; f == nil || f.BurnPerHour != 0 || f.ExhaustsAt != nil {
			t.Errorf("idle weekly forecast %v, want 0/h and no exhaustion", f)
		}
		if f := i[windowFiveHour]; f != nil {
			t.Errorf("idle five-hour forecast %v for a window that has reset", f)
		}
		if f := accts["bare"].GetForecasts(); len(f) != 0 {
			t.Errorf("bare forecasts %v from history older than the lookback", f)
		}
	}
	list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	accts := map[string]*weirv1.Account{}
	for _, a := range list.Msg.Accounts {
		accts[a.Label] = a
	}
	check(t, accts)
	for _, label := range []string{"burning", "idle", "bare"} {
		got, err := e.admin.accounts.GetAccount(t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: label}))
		if err != nil {
			t.Fatal(err)
		}
		accts[label] = got.Msg.Account
	}
	check(t, accts)
}
