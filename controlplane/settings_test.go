package controlplane

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/rpcclient"
)

// settingsClient is a SettingsService client holding token.
func (e *env) settingsClient(token string) weirv1connect.SettingsServiceClient {
	e.t.Helper()
	hc := rpcclient.HTTPClient()
	e.t.Cleanup(hc.CloseIdleConnections)
	return weirv1connect.NewSettingsServiceClient(hc, e.ts.URL, connect.WithInterceptors(rpcclient.Token(token)))
}

func (e *env) getSettings() *weirv1.Settings {
	e.t.Helper()
	resp, err := e.settingsClient(e.cfg.AdminToken).GetSettings(e.t.Context(), connect.NewRequest(&weirv1.GetSettingsRequest{}))
	if err != nil {
		e.t.Fatalf("GetSettings: %v", err)
	}
	return resp.Msg.Settings
}

func (e *env) updateSettings(st *weirv1.Settings, paths ...string) (*weirv1.Settings, error) {
	e.t.Helper()
	resp, err := e.settingsClient(e.cfg.AdminToken).UpdateSettings(e.t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings: st, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Settings, nil
}

func wantSettings(t *testing.T, what string, got *weirv1.Settings, hold, deadline time.Duration) {
	t.Helper()
	if got.GetCapacityHold() == nil || got.GetRequestDeadline() == nil ||
		got.CapacityHold.AsDuration() != hold || got.RequestDeadline.AsDuration() != deadline {
		t.Fatalf("%s: settings %v, want capacity_hold %v request_deadline %v", what, got, hold, deadline)
	}
}

func TestSettingsDefaults(t *testing.T) {
	t.Parallel()
	e := setup(t)
	wantSettings(t, "defaults", e.getSettings(), 20*time.Minute, 25*time.Minute)

	// A replica configured otherwise reports its own Config until an
	// operator sets a value; a negative CapacityHold means fail fast.
	clock := newClock()
	cfg := testConfig(clock)
	cfg.CapacityHold, cfg.RequestDeadline = -1, 40*time.Minute
	custom := newEnv(t, pgtest.NewPool(t), cfg, clock)
	wantSettings(t, "configured", custom.getSettings(), 0, 40*time.Minute)
}

func TestUpdateSettings(t *testing.T) {
	t.Parallel()
	e := setup(t)
	got, err := e.updateSettings(&weirv1.Settings{CapacityHold: durationpb.New(5 * time.Minute)}, "capacity_hold")
	if err != nil {
		t.Fatalf("UpdateSettings: %v", err)
	}
	wantSettings(t, "update response", got, 5*time.Minute, 25*time.Minute)
	wantSettings(t, "after capacity_hold", e.getSettings(), 5*time.Minute, 25*time.Minute)

	// Fields outside the mask are ignored, even when set.
	now := e.clock.Advance(time.Minute)
	got, err = e.updateSettings(&weirv1.Settings{
		CapacityHold: durationpb.New(time.Hour), RequestDeadline: durationpb.New(90 * time.Minute),
	}, "request_deadline")
	if err != nil {
		t.Fatalf("UpdateSettings: %v", err)
	}
	wantSettings(t, "after request_deadline", got, 5*time.Minute, 90*time.Minute)

	// 0 turns holding off; a hold longer than the deadline is allowed (the
	// deadline bounds it).
	if _, err := e.updateSettings(&weirv1.Settings{CapacityHold: durationpb.New(0), RequestDeadline: durationpb.New(time.Minute)},
		"capacity_hold", "request_deadline"); err != nil {
		t.Fatalf("UpdateSettings both: %v", err)
	}
	wantSettings(t, "zero hold", e.getSettings(), 0, time.Minute)
	if _, err := e.updateSettings(&weirv1.Settings{CapacityHold: durationpb.New(6 * time.Hour)}, "capacity_hold"); err != nil {
		t.Fatalf("hold above the deadline: %v", err)
	}
	wantSettings(t, "hold above deadline", e.getSettings(), 6*time.Hour, time.Minute)

	// Stored as Go durations, stamped by the injected clock.
	var value string
	var updated time.Time
	if err := e.pool.QueryRow(t.Context(), `SELECT value, updated_at FROM settings WHERE name = 'request_deadline'`).Scan(&value, &updated); err != nil {
		t.Fatal(err)
	}
	if value != "1m0s" || !updated.Equal(now) {
		t.Errorf("stored request_deadline %q at %v, want 1m0s at %v", value, updated, now)
	}

	// Another replica of the same deployment sees the same values.
	wantSettings(t, "replica", e.replica().getSettings(), 6*time.Hour, time.Minute)
}

func TestUpdateSettingsInvalid(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := durationpb.New
	for _, tc := range []struct {
		name  string
		st    *weirv1.Settings
		paths []string
		want  string
	}{
		{"empty mask", &weirv1.Settings{CapacityHold: d(time.Minute)}, nil, "update_mask"},
		{"unknown field", &weirv1.Settings{}, []string{"bogus"}, `update_mask: unknown field "bogus"`},
		{"field named but not set", &weirv1.Settings{}, []string{"capacity_hold"}, "settings.capacity_hold: required"},
		{"no settings", nil, []string{"request_deadline"}, "settings.request_deadline: required"},
		{"negative hold", &weirv1.Settings{CapacityHold: d(-time.Second)}, []string{"capacity_hold"}, "settings.capacity_hold:"},
		{"hold too long", &weirv1.Settings{CapacityHold: d(6*time.Hour + time.Second)}, []string{"capacity_hold"}, "settings.capacity_hold:"},
		{"deadline too short", &weirv1.Settings{RequestDeadline: d(59 * time.Second)}, []string{"request_deadline"}, "settings.request_deadline:"},
		{"deadline too long", &weirv1.Settings{RequestDeadline: d(7 * time.Hour)}, []string{"request_deadline"}, "settings.request_deadline:"},
		{"invalid duration", &weirv1.Settings{CapacityHold: &durationpb.Duration{Seconds: 1, Nanos: -1}}, []string{"capacity_hold"}, "settings.capacity_hold:"},
		// One bad field spoils the whole request.
		{"one good, one bad", &weirv1.Settings{CapacityHold: d(time.Minute), RequestDeadline: d(time.Second)},
			[]string{"capacity_hold", "request_deadline"}, "settings.request_deadline:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.updateSettings(tc.st, tc.paths...)
			ce := wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(ce.Message(), tc.want) {
				t.Errorf("message %q does not say %q", ce.Message(), tc.want)
			}
		})
	}
	if n := e.count(`SELECT count(*) FROM settings`); n != 0 {
		t.Errorf("%d settings stored by rejected updates", n)
	}
	wantSettings(t, "after rejected updates", e.getSettings(), 20*time.Minute, 25*time.Minute)
}

func TestSettingsAuth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Operators' service: the data-plane token does not open it.
	_, err := e.settingsClient(e.cfg.DataplaneToken).GetSettings(t.Context(), connect.NewRequest(&weirv1.GetSettingsRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated)
	_, err = e.settingsClient(e.cfg.DataplaneToken).UpdateSettings(t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings: &weirv1.Settings{CapacityHold: durationpb.New(0)}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"capacity_hold"}},
	}))
	wantCode(t, err, connect.CodeUnauthenticated)
	// Workers' call: the admin token does not open it.
	_, err = e.admin.leases.WorkerSettings(t.Context(), connect.NewRequest(&weirv1.WorkerSettingsRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

func TestWorkerSettings(t *testing.T) {
	t.Parallel()
	e := setup(t)
	worker := func() *weirv1.Settings {
		t.Helper()
		resp, err := e.dp.leases.WorkerSettings(t.Context(), connect.NewRequest(&weirv1.WorkerSettingsRequest{}))
		if err != nil {
			t.Fatalf("WorkerSettings: %v", err)
		}
		return resp.Msg.Settings
	}
	wantSettings(t, "worker defaults", worker(), 20*time.Minute, 25*time.Minute)
	if _, err := e.updateSettings(&weirv1.Settings{CapacityHold: durationpb.New(90 * time.Second), RequestDeadline: durationpb.New(10 * time.Minute)},
		"capacity_hold", "request_deadline"); err != nil {
		t.Fatalf("UpdateSettings: %v", err)
	}
	wantSettings(t, "worker after update", worker(), 90*time.Second, 10*time.Minute)
}

// TestSettingsUnreadableValue: a value no release could have written is an
// error, not a silent default.
func TestSettingsUnreadableValue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.pool.Exec(t.Context(), `INSERT INTO settings (name, value, updated_at) VALUES
		('capacity_hold', 'soon', $1), ('from_a_newer_release', 'x', $1)`, epoch); err != nil {
		t.Fatal(err)
	}
	_, err := e.dp.leases.WorkerSettings(t.Context(), connect.NewRequest(&weirv1.WorkerSettingsRequest{}))
	wantCode(t, err, connect.CodeInternal)
	// Unknown names are skipped; a good value works again.
	if _, err := e.pool.Exec(t.Context(), `UPDATE settings SET value = '3m0s' WHERE name = 'capacity_hold'`); err != nil {
		t.Fatal(err)
	}
	wantSettings(t, "repaired", e.getSettings(), 3*time.Minute, 25*time.Minute)
}

// FuzzSettingsFrom: whatever rows the settings table holds (a newer
// replica's names, values edited by hand), reading them never panics, and
// either fails naming the setting or yields settings in the ranges
// UpdateSettings enforces and a known quota response mode.
func FuzzSettingsFrom(f *testing.F) {
	for _, r := range [][2]string{
		{settingCapacityHold, "20m0s"},
		{settingRequestDeadline, "25m0s"},
		{settingQuotaResponseMode, "QUOTA_RESPONSE_MODE_USAGE_LIMIT"},
		{settingCapacityHold, "-1ns"},
		{settingRequestDeadline, "1000000h"},
		{settingCapacityHold, "soon"},
		{"a_newer_setting", "x"},
		{settingQuotaResponseMode, ""},
	} {
		f.Add(r[0], r[1], settingCapacityHold, "0s")
	}
	s := newSettingsSource(nil, Config{CapacityHold: 20 * time.Minute, RequestDeadline: 25 * time.Minute})
	f.Fuzz(func(t *testing.T, name1, value1, name2, value2 string) {
		st, err := s.from([]db.Setting{{Name: name1, Value: value1}, {Name: name2, Value: value2}})
		if err != nil {
			if !strings.Contains(err.Error(), "setting ") {
				t.Errorf("error %q does not name the setting", err)
			}
			return
		}
		hold, deadline := st.CapacityHold.AsDuration(), st.RequestDeadline.AsDuration()
		if hold < 0 || hold > maxCapacityHold {
			t.Errorf("capacity hold %v out of range", hold)
		}
		if deadline < minRequestDeadline || deadline > maxRequestDeadline {
			t.Errorf("request deadline %v out of range", deadline)
		}
		if weirv1.QuotaResponseMode_name[int32(st.QuotaResponseMode)] == "" || st.QuotaResponseMode == weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_UNSPECIFIED {
			t.Errorf("quota response mode %v", st.QuotaResponseMode)
		}
	})
}

// TestUnreachableHoldSetting: 30 s unless configured or set, checked like
// capacity_hold, audited, and what workers are sent.
func TestUnreachableHoldSetting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if got := e.getSettings().GetUnreachableHold(); got.AsDuration() != 30*time.Second {
		t.Fatalf("default unreachable_hold %v, want 30s", got)
	}
	clock := newClock()
	cfg := testConfig(clock)
	cfg.UnreachableHold = -1
	if got := newEnv(t, pgtest.NewPool(t), cfg, clock).getSettings().GetUnreachableHold(); got == nil || got.AsDuration() != 0 {
		t.Fatalf("a negative UnreachableHold: %v, want 0 (fail fast)", got)
	}
	for _, bad := range []time.Duration{-time.Second, 7 * time.Hour} {
		_, err := e.updateSettings(&weirv1.Settings{UnreachableHold: durationpb.New(bad)}, "unreachable_hold")
		if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), "settings.unreachable_hold") {
			t.Errorf("%v: %v", bad, ce)
		}
	}
	got, err := e.updateSettings(&weirv1.Settings{UnreachableHold: durationpb.New(90 * time.Second)}, "unreachable_hold")
	if err != nil || got.GetUnreachableHold().AsDuration() != 90*time.Second || got.GetCapacityHold().AsDuration() != 20*time.Minute {
		t.Fatalf("UpdateSettings: %v, %v", got, err)
	}
	ws, err := e.dp.leases.WorkerSettings(t.Context(), connect.NewRequest(&weirv1.WorkerSettingsRequest{}))
	if err != nil || ws.Msg.Settings.GetUnreachableHold().AsDuration() != 90*time.Second {
		t.Fatalf("WorkerSettings: %v, %v", ws, err)
	}
	if n := e.count(`SELECT count(*) FROM setting_changes WHERE name = 'unreachable_hold' AND new_value = '1m30s'`); n != 1 {
		t.Errorf("%d audit rows for the change", n)
	}
}

// TestBodyBufferSettings: 1GiB and 128MiB unless configured or set,
// checked against their range, stored as sizes, audited, and what workers
// are sent.
func TestBodyBufferSettings(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if st := e.getSettings(); st.GetBodyBufferBytes() != 1<<30 || st.GetBodyBufferPerKeyBytes() != 128<<20 {
		t.Fatalf("defaults %d, %d", st.GetBodyBufferBytes(), st.GetBodyBufferPerKeyBytes())
	}
	clock := newClock()
	cfg := testConfig(clock)
	cfg.BodyBuffer, cfg.BodyBufferPerKey = 512<<20, 64<<20
	if st := newEnv(t, pgtest.NewPool(t), cfg, clock).getSettings(); st.GetBodyBufferBytes() != 512<<20 || st.GetBodyBufferPerKeyBytes() != 64<<20 {
		t.Fatalf("configured %d, %d", st.GetBodyBufferBytes(), st.GetBodyBufferPerKeyBytes())
	}
	for _, bad := range []int64{0, -1, 1<<20 - 1, 1<<40 + 1} {
		_, err := e.updateSettings(&weirv1.Settings{BodyBufferBytes: bad}, "body_buffer_bytes")
		if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), "settings.body_buffer_bytes") {
			t.Errorf("%d: %v", bad, ce)
		}
	}
	got, err := e.updateSettings(&weirv1.Settings{BodyBufferBytes: 2 << 30, BodyBufferPerKeyBytes: 100 << 20},
		"body_buffer_bytes", "body_buffer_per_key_bytes")
	if err != nil || got.GetBodyBufferBytes() != 2<<30 || got.GetBodyBufferPerKeyBytes() != 100<<20 {
		t.Fatalf("UpdateSettings: %v, %v", got, err)
	}
	ws, err := e.dp.leases.WorkerSettings(t.Context(), connect.NewRequest(&weirv1.WorkerSettingsRequest{}))
	if err != nil || ws.Msg.Settings.GetBodyBufferBytes() != 2<<30 || ws.Msg.Settings.GetBodyBufferPerKeyBytes() != 100<<20 {
		t.Fatalf("WorkerSettings: %v, %v", ws, err)
	}
	if n := e.count(`SELECT count(*) FROM setting_changes WHERE name = 'body_buffer_bytes' AND new_value = '2GiB'`); n != 1 {
		t.Errorf("%d audit rows for the change", n)
	}
}

// TestRouteRetentionSetting: 30 days unless set, checked against its
// range (1h to ten years), stored as a duration, audited, and what the
// retention job reads.
func TestRouteRetentionSetting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if st := e.getSettings(); st.GetRouteEventsRetention().AsDuration() != 30*24*time.Hour {
		t.Fatalf("default %v", st.GetRouteEventsRetention().AsDuration())
	}
	for _, bad := range []time.Duration{0, 59 * time.Minute, 10*365*24*time.Hour + time.Hour} {
		_, err := e.updateSettings(&weirv1.Settings{RouteEventsRetention: durationpb.New(bad)}, "route_events_retention")
		if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), "settings.route_events_retention") {
			t.Errorf("%v: %v", bad, ce)
		}
	}
	got, err := e.updateSettings(&weirv1.Settings{RouteEventsRetention: durationpb.New(7 * 24 * time.Hour)}, "route_events_retention")
	if err != nil || got.GetRouteEventsRetention().AsDuration() != 7*24*time.Hour {
		t.Fatalf("UpdateSettings: %v, %v", got, err)
	}
	if d, err := e.srv.RouteRetention(t.Context()); err != nil || d != 7*24*time.Hour {
		t.Errorf("RouteRetention: %v, %v", d, err)
	}
	if n := e.count(`SELECT count(*) FROM setting_changes WHERE name = 'route_events_retention' AND new_value = '168h0m0s'`); n != 1 {
		t.Errorf("%d audit rows for the change", n)
	}
}

// TestNotifySettings: pool_low_accounts (1 unless set, 0 to 100; 0 turns
// pool_low off) and breaker_notify_after (5m unless set, 0 to 24h), each
// checked, stored and read back; an unreadable stored value fails reads.
func TestNotifySettings(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if st := e.getSettings(); st.GetPoolLowAccounts() != 1 || st.GetBreakerNotifyAfter().AsDuration() != 5*time.Minute {
		t.Fatalf("defaults: pool_low_accounts %d, breaker_notify_after %v", st.GetPoolLowAccounts(), st.GetBreakerNotifyAfter().AsDuration())
	}
	for _, bad := range []int32{-1, 101} {
		_, err := e.updateSettings(&weirv1.Settings{PoolLowAccounts: bad}, "pool_low_accounts")
		if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), "settings.pool_low_accounts") {
			t.Errorf("%d: %v", bad, ce)
		}
	}
	for _, bad := range []time.Duration{-time.Second, 25 * time.Hour} {
		_, err := e.updateSettings(&weirv1.Settings{BreakerNotifyAfter: durationpb.New(bad)}, "breaker_notify_after")
		if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), "settings.breaker_notify_after") {
			t.Errorf("%v: %v", bad, ce)
		}
	}
	got, err := e.updateSettings(&weirv1.Settings{PoolLowAccounts: 0, BreakerNotifyAfter: durationpb.New(90 * time.Second)},
		"pool_low_accounts", "breaker_notify_after")
	if err != nil || got.GetPoolLowAccounts() != 0 || got.GetBreakerNotifyAfter().AsDuration() != 90*time.Second {
		t.Fatalf("UpdateSettings: %v, %v", got, err)
	}
	if st := e.getSettings(); st.GetPoolLowAccounts() != 0 || st.GetBreakerNotifyAfter().AsDuration() != 90*time.Second {
		t.Errorf("read back: %v", st)
	}
	e.exec(`UPDATE settings SET value = 'many' WHERE name = 'pool_low_accounts'`)
	if err := e.srv.WatchNotifications(t.Context()); err == nil || !strings.Contains(err.Error(), "pool_low_accounts") {
		t.Errorf("the watch over an unreadable setting: %v", err)
	}
}
