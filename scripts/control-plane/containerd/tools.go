//go:build tools

// The packages built: containerd (with its CRI plugin, where CDI is on by default) and the runc shim it starts
// each pod's containers through (github.com/containerd/containerd/v2/cmd/containerd and .../cmd/containerd-shim-runc-v2).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
)
