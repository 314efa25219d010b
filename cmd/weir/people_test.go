package main

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestPeopleEnv(t *testing.T) {
	t.Parallel()
	base := map[string]string{"WEIR_ADMIN_TOKEN": strings.Repeat("a", 16), "WEIR_DATAPLANE_TOKEN": strings.Repeat("d", 16), "WEIR_SECRET_KEY": strings.Repeat("ab", 32)}
	oidc := map[string]string{"WEIR_OIDC_ISSUER": "https://idp.example.com", "WEIR_OIDC_CLIENT_ID": "weir",
		"WEIR_OIDC_REDIRECT_URL": "https://weir.example.com/dashboard/oidc/callback", "WEIR_OIDC_ROLES": "admin=alice@example.com"}
	with := func(sets ...map[string]string) map[string]string {
		m := maps.Clone(base)
		for _, s := range sets {
			maps.Copy(m, s)
		}
		return m
	}
	for _, tc := range []struct {
		vars    map[string]string
		proxies []string
		wantErr string
	}{
		{vars: base},
		{vars: with(oidc)},
		{vars: with(map[string]string{"WEIR_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.7,fd00::/8"}), proxies: []string{"10.0.0.0/8", "192.0.2.7/32", "fd00::/8"}},
		{vars: with(map[string]string{"WEIR_TRUSTED_PROXIES": "10.0.0.0/8,proxy.local"}), wantErr: "WEIR_TRUSTED_PROXIES"},
		{vars: with(oidc, map[string]string{"WEIR_OIDC_ROLES": ""}), wantErr: "WEIR_OIDC_ROLES"},
		{vars: with(oidc, map[string]string{"WEIR_OIDC_ROLES": "root=alice@example.com"}), wantErr: "WEIR_OIDC_ROLES"},
		{vars: with(oidc, map[string]string{"WEIR_OIDC_CLIENT_ID": ""}), wantErr: "WEIR_OIDC_CLIENT_ID"},
		{vars: with(oidc, map[string]string{"WEIR_OIDC_REDIRECT_URL": ""}), wantErr: "WEIR_OIDC_REDIRECT_URL"},
		{vars: with(oidc, map[string]string{"WEIR_OIDC_ISSUER": "idp.example.com"}), wantErr: "WEIR_OIDC_ISSUER"},
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
		case !slices.Equal(prefixStrings(cfg.TrustedProxies), tc.proxies):
			t.Errorf("%v: TrustedProxies %v, want %v", tc.vars, cfg.TrustedProxies, tc.proxies)
		}
	}
}

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}
