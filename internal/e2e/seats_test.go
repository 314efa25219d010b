package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestSeatsOwnersOnly: two Claude subscriptions, one of them alice's
// seat (ranked first by priority, and with room to spare), and two keys,
// alice's and bob's, under owned_accounts=owners_only. Many concurrent
// requests of bob's all succeed, held in turn for the shared account,
// and not one reaches the seat upstream; alice's are served on her seat.
func TestSeatsOwnersOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, options{hold: 30 * time.Second, accounts: []account{
		{label: "alice-max", oauth: true, priority: 10, maxConc: 8},
		{label: "shared-pro", oauth: true, maxConc: 2},
	}})
	ctx := t.Context()
	bob, err := e.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "bob"}))
	if err != nil {
		t.Fatal(err)
	}
	e.change(func() {
		if _, err := e.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{Id: "alice-max",
			Owner:      &weirv1.AccountOwner{Kind: weirv1.OwnerKind_OWNER_KIND_KEY, Name: e.keyID},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"owner"}}})); err != nil {
			t.Fatalf("set the seat's owner: %v", err)
		}
	})
	e.change(func() {
		if _, err := e.settings.UpdateSettings(ctx, connect.NewRequest(&weirv1.UpdateSettingsRequest{
			Settings:   &weirv1.Settings{OwnedAccounts: weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"owned_accounts"}},
		})); err != nil {
			t.Fatalf("set owned_accounts: %v", err)
		}
	})

	const requests = 24
	var wg sync.WaitGroup
	statuses := make([]int, requests)
	for i := range requests {
		wg.Go(func() { statuses[i] = e.postAs(bob.Msg.Secret, i%2 == 0).status })
	}
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("bob's request %d: status %d", i, s)
		}
	}
	bobs := e.attempts()
	if len(bobs) < requests {
		t.Fatalf("%d upstream attempts for %d requests: %v", len(bobs), requests, bobs)
	}
	for _, a := range bobs {
		if !strings.HasPrefix(a, "shared-pro:") {
			t.Errorf("bob's request reached %s", a)
		}
	}

	for i := range 6 {
		if r := e.postAs(e.key, i%2 == 0); r.status != http.StatusOK {
			t.Fatalf("alice's request %d: status %d: %s", i, r.status, r.body)
		}
	}
	alices := e.attempts()[len(bobs):]
	if len(alices) != 6 {
		t.Fatalf("alice's attempts: %v", alices)
	}
	for _, a := range alices {
		if !strings.HasPrefix(a, "alice-max:") {
			t.Errorf("alice's request reached %s, not her seat", a)
		}
	}
}
