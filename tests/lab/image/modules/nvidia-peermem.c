// SPDX-License-Identifier: GPL-2.0
/*
 * Dummy "nvidia-peermem" for the rdmad lab. It registers an ib_client
 * (an exported ib_core symbol) and calls a symbol exported by the dummy
 * nvidia module, so modinfo shows depends=ib_core,nvidia as in life and
 * `modprobe -r ib_core` fails while it is loaded.
 *
 * Built a second time with -DLAB_UNKNOWN_SYMBOL (kept outside /lib/modules): that copy
 * calls a symbol no module exports, so loading it fails, and only the kernel log names
 * the symbol (modprobe says "Unknown symbol in module, or unknown parameter").
 */
#include <linux/module.h>
#include <rdma/ib_verbs.h>

#ifdef LAB_UNKNOWN_SYMBOL
extern int nvidia_lab_missing_symbol(void);
#define nvidia_lab_dummy_ping nvidia_lab_missing_symbol
#else
extern int nvidia_lab_dummy_ping(void);
#endif

static int peermem_lab_add(struct ib_device *device)
{
	return 0;
}

static void peermem_lab_remove(struct ib_device *device, void *client_data)
{
}

static struct ib_client peermem_lab_client = {
	.name = "nvidia_peermem_lab",
	.add = peermem_lab_add,
	.remove = peermem_lab_remove,
};

static int __init peermem_lab_init(void)
{
	int ret = nvidia_lab_dummy_ping();

	if (ret)
		return ret;
	return ib_register_client(&peermem_lab_client);
}

static void __exit peermem_lab_exit(void)
{
	ib_unregister_client(&peermem_lab_client);
}

module_init(peermem_lab_init);
module_exit(peermem_lab_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("rdmad lab dummy standing in for nvidia-peermem");
