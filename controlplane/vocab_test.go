package controlplane

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// checkEnum round-trips every value of E through its short name and
// returns the enum's full name.
func checkEnum[E protoEnum](t *testing.T) protoreflect.FullName {
	t.Helper()
	var zero E
	d := zero.Descriptor()
	prefix := vocab.Prefix(d)
	seen := map[string]bool{}
	values := d.Values()
	for i := range values.Len() {
		vd := values.Get(i)
		v := E(vd.Number())
		if !strings.HasPrefix(string(vd.Name()), prefix) {
			t.Errorf("%s: value %s lacks the prefix %s", d.FullName(), vd.Name(), prefix)
		}
		name := enumName(v)
		if want := strings.ToLower(strings.TrimPrefix(string(vd.Name()), prefix)); name != want || name == "" {
			t.Errorf("enumName(%s) = %q, want %q", vd.Name(), name, want)
		}
		if seen[name] {
			t.Errorf("%s: two values named %q", d.FullName(), name)
		}
		seen[name] = true
		if got := enumValue[E](name); got != v {
			t.Errorf("enumValue[%s](%q) = %v, want %v", d.Name(), name, got, v)
		}
		if got := enumValue[E](strings.ToUpper(name)); got != v {
			t.Errorf("enumValue[%s](%q) = %v, want %v", d.Name(), strings.ToUpper(name), got, v)
		}
	}
	for _, bad := range []string{"", "bogus", prefix + "x", string(values.Get(values.Len() - 1).Name())} {
		if got := enumValue[E](bad); got != zero {
			t.Errorf("enumValue[%s](%q) = %v, want the zero value", d.Name(), bad, got)
		}
	}
	return d.FullName()
}

func TestEnumRoundTrip(t *testing.T) {
	t.Parallel()
	covered := map[protoreflect.FullName]bool{
		checkEnum[weirv1.Provider](t):             true,
		checkEnum[weirv1.AuthKind](t):             true,
		checkEnum[weirv1.AccountState](t):         true,
		checkEnum[weirv1.CooldownReason](t):       true,
		checkEnum[weirv1.OutcomeClass](t):         true,
		checkEnum[weirv1.Action](t):               true,
		checkEnum[weirv1.NoAccountReason](t):      true,
		checkEnum[weirv1.FailureStage](t):         true,
		checkEnum[weirv1.Surface](t):              true,
		checkEnum[weirv1.QuotaResponseMode](t):    true,
		checkEnum[weirv1.QuotaKind](t):            true,
		checkEnum[weirv1.MeteredAccounts](t):      true,
		checkEnum[weirv1.RouteOutcome](t):         true,
		checkEnum[weirv1.TransportCause](t):       true,
		checkEnum[weirv1.BudgetUnit](t):           true,
		checkEnum[weirv1.BudgetPeriod](t):         true,
		checkEnum[weirv1.NotifyTargetKind](t):     true,
		checkEnum[weirv1.NotifyDeliveryStatus](t): true,
		checkEnum[weirv1.OwnedAccounts](t):        true,
		checkEnum[weirv1.OwnerKind](t):            true,
		checkEnum[weirv1.AccountCheck](t):         true,
	}
	// Every enum the package defines is in the list above.
	n := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("weir.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Enums().Len() {
			n++
			if name := f.Enums().Get(i).FullName(); !covered[name] {
				t.Errorf("enum %s is not round-tripped", name)
			}
		}
		return true
	})
	if n != len(covered) {
		t.Errorf("weir.v1 defines %d enums, %d covered", n, len(covered))
	}
}

// TestStoredNames pins the names the database holds: changing one is a
// migration, not a rename.
func TestStoredNames(t *testing.T) {
	t.Parallel()
	for got, want := range map[string]string{
		enumName(weirv1.Provider_PROVIDER_ANTHROPIC):                       "anthropic",
		enumName(weirv1.AuthKind_AUTH_KIND_API_KEY):                        "api_key",
		enumName(weirv1.AuthKind_AUTH_KIND_OAUTH):                          "oauth",
		enumName(weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT):          "transport",
		enumName(weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED):       "rate_limited",
		enumName(weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL): "invalid_credential",
		enumName(weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED):         "overloaded",
		enumName(weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED):    "quota_exhausted",
		enumName(weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS):     "out_of_credits",
		enumName(weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY):     "at_capacity",
		enumName(weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR):        "transport_error",
		enumName(weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT):          "before_output",
		enumName(weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT):           "after_output",
		enumName(weirv1.Provider_PROVIDER_OPENAI):                          "openai",
		enumName(weirv1.Provider_PROVIDER_CODEX):                           "codex",
		enumName(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT): "usage_limit",
		enumName(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE):   "retryable",
		enumName(weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT):            "codex_usage_limit",
		enumName(weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_OUT_OF_CREDITS):     "anthropic_out_of_credits",
		enumName(weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL):           "normal",
		enumName(weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT):      "last_resort",
		enumName(weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER):            "never",
		enumName(weirv1.TransportCause_TRANSPORT_CAUSE_DNS):                "dns",
	} {
		if got != want {
			t.Errorf("stored name %q, want %q", got, want)
		}
	}
	// Quota reasons end by time: never "permanent" for a hold.
	for r, want := range map[weirv1.CooldownReason]bool{
		weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT:          true,
		weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED:       true,
		weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED:         true,
		weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED:    true,
		weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS:     true,
		weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL: false,
	} {
		if transientReason(r) != want {
			t.Errorf("transientReason(%v) = %v", r, !want)
		}
	}
}
