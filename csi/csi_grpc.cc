// SPDX-License-Identifier: MIT
/*
 * csi_grpc: the gRPC shell of dstage-csi, the project's only C++ (Debian's
 * gRPC has a C++ server API and no supported C one; docs/architecture.md).
 * Each handler copies its request into csi.h's plain structs, calls one C
 * function, and turns the 0 or -errno it returns into a status with
 * csi_status_code() and the C side's message. No decision is made here.
 *
 * Threads: gRPC's synchronous server calls the handlers from its own
 * pool; the C core does its own locking (csi_node.c).
 */
#include <grpcpp/grpcpp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "csi.grpc.pb.h"
#include "csi.pb.h"

extern "C" {
#include "csi.h"
}

namespace {

grpc::Status csi_status(int err, const char *msg)
{
	if (!err)
		return grpc::Status::OK;
	return grpc::Status(static_cast<grpc::StatusCode>(csi_status_code(err)),
			    msg[0] ? msg : std::strerror(-err));
}

class Identity final : public csi::v1::Identity::Service {
    public:
	explicit Identity(struct csi_node *n) : n_(n) {}

	grpc::Status GetPluginInfo(grpc::ServerContext *,
				   const csi::v1::GetPluginInfoRequest *,
				   csi::v1::GetPluginInfoResponse *out) override
	{
		out->set_name(CSI_DRIVER_NAME);
		out->set_vendor_version(DSTAGE_VERSION);
		return grpc::Status::OK;
	}

	grpc::Status GetPluginCapabilities(
		grpc::ServerContext *,
		const csi::v1::GetPluginCapabilitiesRequest *,
		csi::v1::GetPluginCapabilitiesResponse *) override
	{
		return grpc::Status::OK; /* no controller service */
	}

	grpc::Status Probe(grpc::ServerContext *, const csi::v1::ProbeRequest *,
			   csi::v1::ProbeResponse *out) override
	{
		char msg[CSI_MSG_MAX] = "";
		int ret = csi_node_probe(n_, msg, sizeof(msg));

		if (ret)
			return csi_status(ret, msg);
		out->mutable_ready()->set_value(true);
		return grpc::Status::OK;
	}

    private:
	struct csi_node *n_;
};

class Node final : public csi::v1::Node::Service {
    public:
	explicit Node(struct csi_node *n) : n_(n) {}

	grpc::Status
	NodePublishVolume(grpc::ServerContext *,
			  const csi::v1::NodePublishVolumeRequest *in,
			  csi::v1::NodePublishVolumeResponse *) override
	{
		std::vector<struct csi_kv> ctx;
		struct csi_publish_req r = {};
		char msg[CSI_MSG_MAX] = "";

		for (const auto &kv : in->volume_context())
			ctx.push_back({ kv.first.c_str(), kv.second.c_str() });
		r.volume_id = in->volume_id().c_str();
		r.target_path = in->target_path().c_str();
		r.access_type = CSI_ACCESS_NONE;
		if (in->has_volume_capability()) {
			const auto &cap = in->volume_capability();

			if (cap.has_block())
				r.access_type = CSI_ACCESS_BLOCK;
			else if (cap.has_mount())
				r.access_type = CSI_ACCESS_MOUNT;
			r.access_mode = cap.access_mode().mode();
		}
		r.readonly = in->readonly();
		r.ctx = ctx.data();
		r.nctx = ctx.size();
		return csi_status(csi_node_publish(n_, &r, msg, sizeof(msg)),
				  msg);
	}

	grpc::Status
	NodeUnpublishVolume(grpc::ServerContext *,
			    const csi::v1::NodeUnpublishVolumeRequest *in,
			    csi::v1::NodeUnpublishVolumeResponse *) override
	{
		char msg[CSI_MSG_MAX] = "";

		return csi_status(csi_node_unpublish(n_,
						     in->volume_id().c_str(),
						     in->target_path().c_str(),
						     msg, sizeof(msg)),
				  msg);
	}

	grpc::Status
	NodeGetVolumeStats(grpc::ServerContext *,
			   const csi::v1::NodeGetVolumeStatsRequest *in,
			   csi::v1::NodeGetVolumeStatsResponse *out) override
	{
		struct csi_vol_stats st;
		char msg[CSI_MSG_MAX] = "";
		int ret = csi_node_stats(n_, in->volume_id().c_str(),
					 in->volume_path().c_str(), &st, msg,
					 sizeof(msg));

		if (ret)
			return csi_status(ret, msg);
		auto *b = out->add_usage();
		b->set_unit(csi::v1::VolumeUsage::BYTES);
		b->set_total(st.bytes_total);
		b->set_used(st.bytes_used);
		b->set_available(st.bytes_avail);
		auto *i = out->add_usage();
		i->set_unit(csi::v1::VolumeUsage::INODES);
		i->set_total(st.inodes_total);
		i->set_used(st.inodes_used);
		i->set_available(st.inodes_avail);
		out->mutable_volume_condition()->set_abnormal(st.abnormal);
		out->mutable_volume_condition()->set_message(st.condition);
		return grpc::Status::OK;
	}

	grpc::Status
	NodeGetCapabilities(grpc::ServerContext *,
			    const csi::v1::NodeGetCapabilitiesRequest *,
			    csi::v1::NodeGetCapabilitiesResponse *out) override
	{
		using Rpc = csi::v1::NodeServiceCapability::RPC;

		for (auto t : { Rpc::GET_VOLUME_STATS, Rpc::VOLUME_CONDITION })
			out->add_capabilities()->mutable_rpc()->set_type(t);
		return grpc::Status::OK;
	}

	grpc::Status NodeGetInfo(grpc::ServerContext *,
				 const csi::v1::NodeGetInfoRequest *,
				 csi::v1::NodeGetInfoResponse *out) override
	{
		out->set_node_id(csi_node_id(n_));
		return grpc::Status::OK;
	}

    private:
	struct csi_node *n_;
};

} // namespace

struct csi_grpc {
	std::unique_ptr<Identity> identity;
	std::unique_ptr<Node> node;
	std::unique_ptr<grpc::Server> server;
};

extern "C" int csi_grpc_start(struct csi_node *n, const char *path,
			      struct csi_grpc **out)
{
	auto *g = new (std::nothrow) csi_grpc;

	if (!g)
		return -ENOMEM;
	if (unlink(path) && errno != ENOENT) {
		int err = errno;

		std::fprintf(stderr, "dstage-csi: removing the old %s: %s\n",
			     path, std::strerror(err));
		delete g;
		return -err;
	}
	g->identity.reset(new Identity(n));
	g->node.reset(new Node(n));
	grpc::ServerBuilder b;
	b.AddListeningPort(std::string("unix://") + path,
			   grpc::InsecureServerCredentials());
	b.RegisterService(g->identity.get());
	b.RegisterService(g->node.get());
	g->server = b.BuildAndStart();
	if (!g->server) {
		std::fprintf(stderr, "dstage-csi: cannot listen on %s\n", path);
		delete g;
		return -EADDRNOTAVAIL;
	}
	*out = g;
	return 0;
}

extern "C" void csi_grpc_stop(struct csi_grpc *g)
{
	if (!g)
		return;
	g->server->Shutdown();
	g->server->Wait();
	delete g;
}
