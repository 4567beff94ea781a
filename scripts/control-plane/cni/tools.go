//go:build tools

// The CNI plugins a pod's network is made of on the real node: bridge (a veth into a host bridge), host-local
// (addresses from the node's pod CIDR), loopback (the pod's lo) and portmap (hostPort, chained after bridge).
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
