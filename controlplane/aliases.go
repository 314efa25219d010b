package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// Model aliases: a name clients may ask for that Acquire resolves to the
// first of its concrete model ids with an eligible account, returning that
// id in the lease for the data plane to send upstream. Resolution is one
// level: targets are concrete ids. A model that is no alias never changes.
// A key may have aliases of its own, which its requests take before the
// global alias of the same name.

// maxAliasTargets bounds an alias's list.
const maxAliasTargets = 16

type aliasService struct {
	weirv1connect.UnimplementedAliasServiceHandler
	store
	now   func() time.Time
	log   *slog.Logger
	watch *poolWatch
}

func (a aliasService) ListAliases(ctx context.Context, _ *connect.Request[weirv1.ListAliasesRequest]) (*connect.Response[weirv1.ListAliasesResponse], error) {
	rows, err := a.q.ListModelAliases(ctx)
	if err != nil {
		return nil, err
	}
	keyRows, err := a.q.ListKeyAliases(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*weirv1.Alias, 0, len(rows)+len(keyRows))
	for _, r := range rows {
		out = append(out, aliasProto(r))
	}
	for _, r := range keyRows {
		out = append(out, keyAliasProto(db.KeyAlias{KeyID: r.KeyID, Alias: r.Alias, Targets: r.Targets, Translate: r.Translate,
			CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}, r.KeyName))
	}
	return connect.NewResponse(&weirv1.ListAliasesResponse{Aliases: out}), nil
}

func (a aliasService) SetAlias(ctx context.Context, req *connect.Request[weirv1.SetAliasRequest]) (*connect.Response[weirv1.SetAliasResponse], error) {
	m := req.Msg
	if err := validModelID("alias", m.Alias); err != nil {
		return nil, err
	}
	if len(m.Targets) == 0 || len(m.Targets) > maxAliasTargets {
		return nil, invalidf("targets: 1 to %d concrete model ids", maxAliasTargets)
	}
	for i, t := range m.Targets {
		if err := validModelID("targets", t); err != nil {
			return nil, err
		}
		if t == m.Alias {
			return nil, invalidf("targets: an alias cannot name itself")
		}
		if slices.Contains(m.Targets[:i], t) {
			return nil, invalidf("targets: %q appears twice", t)
		}
	}
	if m.Key != "" {
		key, err := a.findKey(ctx, m.Key)
		if err != nil {
			return nil, err
		}
		row, err := a.q.SetKeyAlias(ctx, db.SetKeyAliasParams{KeyID: key.ID, Alias: m.Alias, Targets: m.Targets, Translate: m.Translate, Now: a.now()})
		if err != nil {
			return nil, err
		}
		a.log.InfoContext(ctx, "key alias set", "key_id", key.ID, "alias", row.Alias, "targets", row.Targets, "translate", row.Translate)
		a.watch.announce(ctx)
		return connect.NewResponse(&weirv1.SetAliasResponse{Alias: keyAliasProto(row, key.Name)}), nil
	}
	row, err := a.q.SetModelAlias(ctx, db.SetModelAliasParams{Alias: m.Alias, Targets: m.Targets, Translate: m.Translate, Now: a.now()})
	if err != nil {
		return nil, err
	}
	a.log.InfoContext(ctx, "model alias set", "alias", row.Alias, "targets", row.Targets, "translate", row.Translate)
	a.watch.announce(ctx)
	return connect.NewResponse(&weirv1.SetAliasResponse{Alias: aliasProto(row)}), nil
}

func (a aliasService) DeleteAlias(ctx context.Context, req *connect.Request[weirv1.DeleteAliasRequest]) (*connect.Response[weirv1.DeleteAliasResponse], error) {
	var n int64
	var err error
	if ref := req.Msg.Key; ref != "" {
		key, ferr := a.findKey(ctx, ref)
		if ferr != nil {
			return nil, ferr
		}
		n, err = a.q.DeleteKeyAlias(ctx, db.DeleteKeyAliasParams{KeyID: key.ID, Alias: req.Msg.Alias})
	} else {
		n, err = a.q.DeleteModelAlias(ctx, req.Msg.Alias)
	}
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, ErrNotFound
	}
	a.log.InfoContext(ctx, "model alias deleted", "alias", req.Msg.Alias, "key", req.Msg.Key)
	a.watch.announce(ctx)
	return connect.NewResponse(&weirv1.DeleteAliasResponse{}), nil
}

func keyAliasProto(r db.KeyAlias, keyName string) *weirv1.Alias {
	return &weirv1.Alias{Alias: r.Alias, Targets: r.Targets, Translate: r.Translate, KeyId: r.KeyID.String(), KeyName: keyName,
		CreatedAt: timestamppb.New(r.CreatedAt), UpdatedAt: timestamppb.New(r.UpdatedAt)}
}

func aliasProto(r db.ModelAlias) *weirv1.Alias {
	return &weirv1.Alias{Alias: r.Alias, Targets: r.Targets, Translate: r.Translate, CreatedAt: timestamppb.New(r.CreatedAt), UpdatedAt: timestamppb.New(r.UpdatedAt)}
}

// validModelID admits what a model id looks like: 1 to 200 printable ASCII
// characters, no spaces or quotes.
func validModelID(field, id string) error {
	bad := id == "" || len(id) > 200
	for i := 0; i < len(id) && !bad; i++ {
		bad = id[i] <= 0x20 || id[i] > 0x7e || id[i] == '"' || id[i] == '\\'
	}
	if bad {
		return invalidf("%s: 1 to 200 printable ASCII characters, no spaces or quotes", field)
	}
	return nil
}

// modelNotServed is Acquire's refusal of an alias whose every target is
// another provider's model than the surface's, and not marked translate:
// sent on the client's wire it would only be refused upstream.
func modelNotServed(alias string, targets []string, sf weirv1.Surface) error {
	err := connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
		"model alias %q resolves to %s, which the %s API does not serve without translation, and the alias does not allow it (weir aliases set %s … --translate)",
		alias, strings.Join(targets, ", "), surfaceWord(sf), alias))
	if d, derr := connect.NewErrorDetail(&weirv1.ModelNotServed{Model: alias, Targets: targets}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// surfaceWord names a surface for a person.
func surfaceWord(sf weirv1.Surface) string {
	switch sf {
	case weirv1.Surface_SURFACE_RESPONSES:
		return "Responses"
	case weirv1.Surface_SURFACE_CHAT_COMPLETIONS:
		return "Chat Completions"
	}
	return "Messages"
}
