package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// clientKeyPrefix marks weir's client keys so they are recognisable in a
// config file or a leak scanner.
const clientKeyPrefix = "weir_sk_"

type keyService struct {
	weirv1connect.UnimplementedKeyServiceHandler
	s *Server
}

// HashKey is how client keys are stored and looked up: hex SHA-256. The
// data plane hashes before it asks, so a key's secret never leaves it.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func newKeySecret() string {
	b := make([]byte, 32)
	rand.Read(b) //nolint:errcheck // crypto/rand.Read never fails on Linux
	return clientKeyPrefix + hex.EncodeToString(b)
}

func (k keyService) CreateKey(ctx context.Context, req *connect.Request[weirv1.CreateKeyRequest]) (*connect.Response[weirv1.CreateKeyResponse], error) {
	name := req.Msg.Name
	if name == "" || len(name) > 64 || strings.TrimSpace(name) != name {
		return nil, toConnect(invalidf("name: required, at most 64 characters, no surrounding spaces"))
	}
	if _, err := uuid.Parse(name); err == nil {
		return nil, toConnect(invalidf("name: must not look like a key id"))
	}
	secret := newKeySecret()
	row, err := k.s.q.CreateKey(ctx, db.CreateKeyParams{
		Name:    name,
		KeyHash: HashKey(secret),
		Prefix:  secret[:len(clientKeyPrefix)+6],
		Now:     k.s.now(),
	})
	if err != nil {
		return nil, k.s.fail(ctx, "create key", storeErr(err))
	}
	k.s.log.InfoContext(ctx, "client key created", "key_id", row.ID, "name", row.Name)
	return connect.NewResponse(&weirv1.CreateKeyResponse{Key: keyProto(row), Secret: secret}), nil
}

func (k keyService) ListKeys(ctx context.Context, req *connect.Request[weirv1.ListKeysRequest]) (*connect.Response[weirv1.ListKeysResponse], error) {
	rows, err := k.s.q.ListKeys(ctx, req.Msg.IncludeRevoked)
	if err != nil {
		return nil, k.s.fail(ctx, "list keys", err)
	}
	out := make([]*weirv1.Key, 0, len(rows))
	for _, r := range rows {
		out = append(out, keyProto(r))
	}
	return connect.NewResponse(&weirv1.ListKeysResponse{Keys: out}), nil
}

func (k keyService) RevokeKey(ctx context.Context, req *connect.Request[weirv1.RevokeKeyRequest]) (*connect.Response[weirv1.RevokeKeyResponse], error) {
	ref := req.Msg.Id
	if ref == "" {
		return nil, toConnect(invalidf("id: required (a key id or name)"))
	}
	var row db.ClientKey
	var err error
	if id, perr := uuid.Parse(ref); perr == nil {
		row, err = k.s.q.GetKey(ctx, id)
	} else {
		row, err = k.s.q.GetKeyByName(ctx, ref)
	}
	if err != nil {
		return nil, k.s.fail(ctx, "revoke key", storeErr(err))
	}
	if row, err = k.s.q.RevokeKey(ctx, db.RevokeKeyParams{ID: row.ID, Now: k.s.now()}); err != nil {
		return nil, k.s.fail(ctx, "revoke key", storeErr(err))
	}
	k.s.log.InfoContext(ctx, "client key revoked", "key_id", row.ID)
	k.s.watch.announce(ctx) // no worker serves the key once this returns
	return connect.NewResponse(&weirv1.RevokeKeyResponse{Key: keyProto(row)}), nil
}

func keyProto(r db.ClientKey) *weirv1.Key {
	return &weirv1.Key{
		Id:         r.ID.String(),
		Name:       r.Name,
		Prefix:     r.Prefix,
		CreatedAt:  timestamppb.New(r.CreatedAt),
		RevokedAt:  timestampOrNil(r.RevokedAt),
		LastUsedAt: timestampOrNil(r.LastUsedAt),
	}
}
