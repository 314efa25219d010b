package controlplane

import (
	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// An account's run of transport failures: its transport cooldowns, one
// after another with no success between them (accounts.last_success_at
// before the cooldown was written), each counting on from the last. The
// run ends with a success, a cooldown of another reason (the upstream
// answered), a resume or a new base URL. Operators see it as the account
// being unreachable (Account.unreachable, `weir status`); routing reads it
// off the live cooldowns to say that a request's whole pool is
// (NoAccount.unreachable, policy.Route).

// unreachableOf is the run a transport cooldown records, on an account of
// provider whose base URL override is baseURL.
func unreachableOf(c db.Cooldown, provider, baseURL string) *weirv1.Unreachable {
	return policy.Unreachable(policyCooldown(c), accountBaseURL(provider, baseURL))
}
