package main

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSettingsAndExplain runs the operator's capacity commands against a
// real `weir dev --simulate`: change the settings, read them back, then
// explain a request an agent made.
func TestSettingsAndExplain(t *testing.T) {
	t.Parallel()
	// Its own stack: it reads the settings' defaults and history, and
	// changes settings every request of the stack follows.
	dev := startDev(t, t.TempDir())
	admin := dev.admin

	out, err := admin("settings", "get")
	if err != nil || !regexp.MustCompile(`capacity_hold\s+20m\n`).MatchString(out) || !regexp.MustCompile(`request_deadline\s+25m\n`).MatchString(out) {
		t.Fatalf("settings get (defaults): %v: %s", err, out)
	}
	if out, err := admin("settings", "set", "capacity_hold=0"); err != nil || !strings.Contains(out, "fail fast") {
		t.Fatalf("settings set capacity_hold=0: %v: %s", err, out)
	}
	out, err = admin("settings", "get", "--json")
	if err != nil {
		t.Fatalf("settings get --json: %v: %s", err, out)
	}
	var got struct {
		Settings struct{ CapacityHold, RequestDeadline string }
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("settings get --json: %v: %s", err, out)
	}
	if got.Settings.CapacityHold != "0s" || got.Settings.RequestDeadline != "1500s" {
		t.Fatalf("settings after set: %+v", got.Settings)
	}
	if out, err := admin("settings", "set", "metered_accounts=last_resort"); err != nil ||
		!regexp.MustCompile(`metered_accounts\s+last_resort\n`).MatchString(out) {
		t.Fatalf("settings set metered_accounts=last_resort: %v: %s", err, out)
	}
	if out, err := admin("settings", "set", "body_buffer_bytes=2GiB", "body_buffer_per_key_bytes=300MiB"); err != nil ||
		!regexp.MustCompile(`body_buffer_bytes\s+2GiB\n`).MatchString(out) || !regexp.MustCompile(`body_buffer_per_key_bytes\s+300MiB\n`).MatchString(out) {
		t.Fatalf("settings set body_buffer_bytes: %v: %s", err, out)
	}
	if out, err := admin("settings", "history"); err != nil || !regexp.MustCompile(`metered_accounts\s+\(default\)\s+last_resort`).MatchString(out) ||
		!regexp.MustCompile(`body_buffer_per_key_bytes\s+\(default\)\s+300MiB`).MatchString(out) {
		t.Errorf("settings history: %v: %s", err, out)
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"settings", "set", "bogus=1"}, []string{`unknown setting "bogus"`, "capacity_hold", "request_deadline"}},
		{[]string{"settings", "set", "capacity_hold"}, []string{"KEY=VALUE"}},
		{[]string{"settings", "set", "capacity_hold=soon"}, []string{"capacity_hold", "not a duration"}},
		{[]string{"settings", "set", "metered_accounts=sometimes"}, []string{"metered_accounts", "normal, last_resort or never"}},
		{[]string{"settings", "set", "metered_accounts=default"}, []string{"metered_accounts", "not a mode"}},
		{[]string{"settings", "set"}, []string{"at least one"}},
		// Ranges are the control plane's; its message names the field.
		{[]string{"settings", "set", "request_deadline=10s"}, []string{"settings.request_deadline", "out of range"}},
		{[]string{"settings", "set", "body_buffer_bytes=lots"}, []string{"body_buffer_bytes", "not a size"}},
		{[]string{"settings", "set", "body_buffer_per_key_bytes=1KiB"}, []string{"settings.body_buffer_per_key_bytes", "out of range"}},
		{[]string{"explain", "no-such-request"}, []string{"not found"}},
	} {
		out, err := admin(tc.args...)
		if err == nil {
			t.Errorf("%v: want an error, got: %s", tc.args, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not say %q", tc.args, err, w)
			}
		}
	}

	resp, body := postMessage(t, dev.DataplaneURL, dev.ClientKey, hello)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("agent request: %d %s", resp.StatusCode, body)
	}
	id := resp.Header.Get("Weir-Request-Id")
	if id == "" {
		t.Fatal("no Weir-Request-Id header")
	}
	// The worker reports the route after the response, off the request path.
	deadline := time.After(15 * time.Second)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err = admin("explain", id)
		if err == nil && !strings.Contains(out, "in progress") {
			break
		}
		if err != nil && !strings.Contains(err.Error(), "not found") {
			t.Fatalf("explain %s: %v: %s", id, err, out)
		}
		select {
		case <-deadline:
			t.Fatalf("the route event of %s was not stored within 15s", id)
		case <-tick.C:
		}
	}
	if !regexp.MustCompile(`(?m)^status\s+200$`).MatchString(out) || !strings.Contains(out, "claude-sonnet-4-5") {
		t.Errorf("explain %s does not show the model and status 200:\n%s", id, out)
	}
	account := regexp.MustCompile(`(?m)^account\s+(\S+)$`).FindStringSubmatch(out)
	if account == nil || !strings.HasPrefix(account[1], "demo-") {
		t.Errorf("explain %s does not name the serving account by label:\n%s", id, out)
	}
	// protojson varies its whitespace from build to build: parse, never
	// match the text.
	var explained struct{ Event struct{ RequestID string } }
	if out, err := admin("explain", id, "--json"); err != nil || json.Unmarshal([]byte(out), &explained) != nil || explained.Event.RequestID != id {
		t.Errorf("explain --json: %v: %s", err, out)
	}
	if out, err := admin("routes"); err != nil || !strings.Contains(out, "HELD") || !strings.Contains(out, id) {
		t.Errorf("routes: %v: %s", err, out)
	}
}

func TestCapacityEnv(t *testing.T) {
	t.Parallel()
	secret := strings.Repeat("ab", 32)
	base := map[string]string{"WEIR_ADMIN_TOKEN": strings.Repeat("a", 16), "WEIR_DATAPLANE_TOKEN": strings.Repeat("d", 16), "WEIR_SECRET_KEY": secret}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for k, v := range base {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		vars           map[string]string
		hold, deadline time.Duration
		wantErr        string
	}{
		{base, 0, 0, ""}, // Config's defaults apply
		{with("WEIR_CAPACITY_HOLD", "5m"), 5 * time.Minute, 0, ""},
		{with("WEIR_CAPACITY_HOLD", "0"), -1, 0, ""}, // fail fast, not "the default"
		{with("WEIR_REQUEST_DEADLINE", "40m"), 0, 40 * time.Minute, ""},
		{with("WEIR_CAPACITY_HOLD", "soon"), 0, 0, "WEIR_CAPACITY_HOLD"},
		{with("WEIR_CAPACITY_HOLD", "-1m"), 0, 0, "WEIR_CAPACITY_HOLD"},
		{with("WEIR_REQUEST_DEADLINE", "0"), 0, 0, "WEIR_REQUEST_DEADLINE"},
		{with("WEIR_REQUEST_DEADLINE", "25"), 0, 0, "WEIR_REQUEST_DEADLINE"},
	} {
		e, _, _ := testEnv(tc.vars, "")
		cfg, err := controlPlaneConfig(e, nil)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want one naming %s", tc.vars, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.vars, err)
		case cfg.CapacityHold != tc.hold || cfg.RequestDeadline != tc.deadline:
			t.Errorf("%v: CapacityHold %v RequestDeadline %v, want %v %v", tc.vars, cfg.CapacityHold, cfg.RequestDeadline, tc.hold, tc.deadline)
		}
	}
}

func TestBodyBufferEnv(t *testing.T) {
	t.Parallel()
	base := map[string]string{"WEIR_ADMIN_TOKEN": strings.Repeat("a", 16), "WEIR_DATAPLANE_TOKEN": strings.Repeat("d", 16), "WEIR_SECRET_KEY": strings.Repeat("ab", 32)}
	for _, tc := range []struct {
		total, perKey string
		want          [2]int64
		wantErr       string
	}{
		{"", "", [2]int64{0, 0}, ""}, // Config's defaults apply
		{"2GiB", "512MiB", [2]int64{2 << 30, 512 << 20}, ""},
		{"1073741824", "", [2]int64{1 << 30, 0}, ""},
		{"lots", "", [2]int64{}, "WEIR_BODY_BUFFER"},
		{"", "1KiB", [2]int64{}, "WEIR_BODY_BUFFER_PER_KEY"},
	} {
		vars := map[string]string{"WEIR_BODY_BUFFER": tc.total, "WEIR_BODY_BUFFER_PER_KEY": tc.perKey}
		for k, v := range base {
			vars[k] = v
		}
		e, _, _ := testEnv(vars, "")
		cfg, err := controlPlaneConfig(e, nil)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr+":") {
				t.Errorf("%v: error %v, want one naming %s", tc, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%v: %v", tc, err)
		case cfg.BodyBuffer != tc.want[0] || cfg.BodyBufferPerKey != tc.want[1]:
			t.Errorf("%v: %d, %d", tc, cfg.BodyBuffer, cfg.BodyBufferPerKey)
		}
	}
}

func TestLeaseReuseEnv(t *testing.T) {
	t.Parallel()
	base := map[string]string{"WEIR_ADMIN_TOKEN": strings.Repeat("a", 16), "WEIR_DATAPLANE_TOKEN": strings.Repeat("d", 16), "WEIR_SECRET_KEY": strings.Repeat("ab", 32)}
	for _, tc := range []struct {
		value   string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false}, // Config's default applies
		{"500ms", 500 * time.Millisecond, false},
		{"0", -1, false}, // off, not "the default"
		{"-1s", 0, true},
		{"soon", 0, true},
	} {
		vars := map[string]string{}
		for k, v := range base {
			vars[k] = v
		}
		if tc.value != "" {
			vars["WEIR_LEASE_REUSE"] = tc.value
		}
		e, _, _ := testEnv(vars, "")
		cfg, err := controlPlaneConfig(e, nil)
		switch {
		case tc.wantErr:
			if err == nil || !strings.Contains(err.Error(), "WEIR_LEASE_REUSE") {
				t.Errorf("%q: error %v, want one naming WEIR_LEASE_REUSE", tc.value, err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.value, err)
		case cfg.LeaseReuse != tc.want:
			t.Errorf("%q: LeaseReuse %v, want %v", tc.value, cfg.LeaseReuse, tc.want)
		}
	}
}
