package controlplane

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestCreateKeyShowsSecretOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	resp, err := e.admin.keys.CreateKey(t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: "ci"}))
	if err != nil {
		t.Fatal(err)
	}
	secret := resp.Msg.Secret
	e.secrets.add(secret)
	hash := HashKey(secret)
	if !strings.HasPrefix(secret, "weir_sk_") || len(secret) != len("weir_sk_")+64 {
		t.Errorf("secret has the wrong shape (%d characters)", len(secret))
	}
	k := resp.Msg.Key
	if k.Name != "ci" || k.Prefix != secret[:14] || !strings.HasPrefix(k.Prefix, "weir_sk_") ||
		k.RevokedAt != nil || k.LastUsedAt != nil || !k.CreatedAt.AsTime().Equal(epoch) {
		t.Errorf("key: %v", k)
	}
	// The Key message itself never carries the secret or its hash.
	requireAbsent(t, "CreateKey.key", k, secret)
	requireAbsent(t, "CreateKey.key", k, hash)

	// Stored hashed, never in the clear.
	if n := e.count(`SELECT count(*) FROM client_keys WHERE key_hash = $1`, hash); n != 1 {
		t.Errorf("no row with the secret's hash")
	}
	if n := e.count(`SELECT count(*) FROM client_keys WHERE strpos(row_to_json(client_keys)::text, $1) > 0`, secret); n != 0 {
		t.Error("the client_keys row holds the secret")
	}

	// A second key has another secret.
	_, hash2 := e.createKey("other")
	if hash2 == hash {
		t.Error("two keys share a secret")
	}

	for _, include := range []bool{false, true} {
		list, err := e.admin.keys.ListKeys(t.Context(), connect.NewRequest(&weirv1.ListKeysRequest{IncludeRevoked: include}))
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Msg.Keys) != 2 {
			t.Errorf("ListKeys: %d keys", len(list.Msg.Keys))
		}
		requireAbsent(t, "ListKeys", list.Msg, secret)
		requireAbsent(t, "ListKeys", list.Msg, hash)
		requireAbsent(t, "ListKeys", list.Msg, hash2)
	}

	v, err := e.dp.leases.VerifyKey(t.Context(), connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hash}))
	if err != nil || v.Msg.KeyId != k.Id || v.Msg.KeyName != "ci" {
		t.Fatalf("VerifyKey: %v %v", v, err)
	}
	requireAbsent(t, "VerifyKey", v.Msg, secret)
	for _, bad := range []string{"", HashKey("weir_sk_guess"), secret, strings.ToUpper(hash)} {
		_, err := e.dp.leases.VerifyKey(t.Context(), connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: bad}))
		wantCode(t, err, connect.CodePermissionDenied)
	}
}

func TestCreateKeyValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createKey("taken")
	for _, tc := range []struct {
		name string
		code connect.Code
	}{
		{"", connect.CodeInvalidArgument},
		{strings.Repeat("n", 65), connect.CodeInvalidArgument},
		{"padded ", connect.CodeInvalidArgument},
		{"0b7a7d3c-5c4e-4a52-9a43-1a3b2c4d5e6f", connect.CodeInvalidArgument},
		{"taken", connect.CodeAlreadyExists},
	} {
		_, err := e.admin.keys.CreateKey(t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: tc.name}))
		ce := wantCode(t, err, tc.code)
		if tc.code == connect.CodeInvalidArgument && !strings.HasPrefix(ce.Message(), "name:") {
			t.Errorf("message %q does not name the field", ce.Message())
		}
	}
	if n := e.count(`SELECT count(*) FROM client_keys`); n != 1 {
		t.Errorf("%d keys, want only the first", n)
	}
}

func TestRevokeKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createAccount(acct{})
	byID, hashID := e.createKey("by-id")
	_, hashName := e.createKey("by-name")
	keep, hashKeep := e.createKey("keep")

	// A revoked key cannot verify or lease, even mid-flight: Acquire re-checks.
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: hashID}); l == nil {
		t.Fatal("no lease before revocation")
	}
	e.clock.Advance(time.Minute)
	resp, err := e.admin.keys.RevokeKey(t.Context(), connect.NewRequest(&weirv1.RevokeKeyRequest{Id: byID.Id}))
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Msg.Key; r.Id != byID.Id || r.RevokedAt == nil || !r.RevokedAt.AsTime().Equal(epoch.Add(time.Minute)) {
		t.Errorf("revoked key: %v", r)
	}
	if _, err := e.admin.keys.RevokeKey(t.Context(), connect.NewRequest(&weirv1.RevokeKeyRequest{Id: "by-name"})); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{hashID, hashName} {
		_, err := e.dp.leases.VerifyKey(t.Context(), connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: h}))
		wantCode(t, err, connect.CodePermissionDenied)
		_, err = e.dp.leases.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: h, RequestId: "r"}))
		wantCode(t, err, connect.CodePermissionDenied)
	}
	if _, err := e.dp.leases.VerifyKey(t.Context(), connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hashKeep})); err != nil {
		t.Errorf("an unrevoked key stopped verifying: %v", err)
	}
	e.mustLease(&weirv1.AcquireRequest{KeyHash: hashKeep})

	// Revoking again keeps the first revocation time.
	e.clock.Advance(time.Hour)
	resp, err = e.admin.keys.RevokeKey(t.Context(), connect.NewRequest(&weirv1.RevokeKeyRequest{Id: "by-id"}))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Msg.Key.RevokedAt.AsTime().Equal(epoch.Add(time.Minute)) {
		t.Errorf("second revoke moved revoked_at to %v", resp.Msg.Key.RevokedAt.AsTime())
	}

	list, err := e.admin.keys.ListKeys(t.Context(), connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Keys) != 1 || list.Msg.Keys[0].Id != keep.Id {
		t.Errorf("ListKeys without revoked: %v", list.Msg.Keys)
	}
	list, err = e.admin.keys.ListKeys(t.Context(), connect.NewRequest(&weirv1.ListKeysRequest{IncludeRevoked: true}))
	if err != nil {
		t.Fatal(err)
	}
	revoked := 0
	for _, k := range list.Msg.Keys {
		if k.RevokedAt != nil {
			revoked++
		}
	}
	if len(list.Msg.Keys) != 3 || revoked != 2 {
		t.Errorf("ListKeys with revoked: %d keys, %d revoked", len(list.Msg.Keys), revoked)
	}

	for _, tc := range []struct {
		ref  string
		code connect.Code
	}{
		{"", connect.CodeInvalidArgument},
		{"nope", connect.CodeNotFound},
		{"7c4e9f5e-0000-4000-8000-000000000000", connect.CodeNotFound},
	} {
		_, err := e.admin.keys.RevokeKey(t.Context(), connect.NewRequest(&weirv1.RevokeKeyRequest{Id: tc.ref}))
		wantCode(t, err, tc.code)
	}
}
