// SPDX-License-Identifier: GPL-2.0
/*
 * gpunode.tuning VM test fixture: a stand-in for NVIDIA's nvidia_peermem.
 *
 * The real module's init returns -EINVAL, without a log message, when it was built without the
 * MOFED peer-memory symbols (kernel-open/nvidia-peermem/nvidia-peermem.c). On the audited node
 * that made `modprobe nvidia_peermem` fail with "could not insert 'nvidia_peermem': Invalid
 * argument". This module does exactly that, so kmod_optional meets the same failure on a real
 * kernel.
 *
 * It is marked in-tree only so that loading it does not add "loading out-of-tree module taints
 * kernel" to the kernel log: on a GPU node the NVIDIA driver has tainted the kernel long before
 * nvidia_peermem is tried, so that warning is not part of the failure being reproduced.
 */
#include <linux/errno.h>
#include <linux/init.h>
#include <linux/module.h>

static int __init nvidia_peermem_stub_init(void)
{
	return -EINVAL;
}
module_init(nvidia_peermem_stub_init);

MODULE_DESCRIPTION("gpunode.tuning test stand-in for nvidia_peermem: init fails with -EINVAL");
MODULE_LICENSE("GPL");
MODULE_INFO(intree, "Y");
