// cudagate under NVRTC: <cub/cub.cuh> without CUB's device-wide algorithms.
//
// The real umbrella header also includes cub/device/ (DeviceReduce, DeviceScan, ...) and
// util_allocator.cuh, which are host code: NVRTC refuses them ("A function explicitly marked as a
// __host__ function is not allowed in JIT mode" with CCCL 3.0, an #error with CCCL 3.1 and later),
// whichever toolkit or package supplies CCCL. A kernel uses the block, warp and thread primitives,
// which compile under NVRTC: this header includes those, each where the CCCL in use has it.
#pragma once
#include <cub/config.cuh>
#if __has_include(<cub/block/block_adjacent_difference.cuh>)
#include <cub/block/block_adjacent_difference.cuh>
#endif
#if __has_include(<cub/block/block_discontinuity.cuh>)
#include <cub/block/block_discontinuity.cuh>
#endif
#if __has_include(<cub/block/block_exchange.cuh>)
#include <cub/block/block_exchange.cuh>
#endif
#if __has_include(<cub/block/block_histogram.cuh>)
#include <cub/block/block_histogram.cuh>
#endif
#if __has_include(<cub/block/block_load.cuh>)
#include <cub/block/block_load.cuh>
#endif
#if __has_include(<cub/block/block_merge_sort.cuh>)
#include <cub/block/block_merge_sort.cuh>
#endif
#if __has_include(<cub/block/block_radix_rank.cuh>)
#include <cub/block/block_radix_rank.cuh>
#endif
#if __has_include(<cub/block/block_radix_sort.cuh>)
#include <cub/block/block_radix_sort.cuh>
#endif
#if __has_include(<cub/block/block_reduce.cuh>)
#include <cub/block/block_reduce.cuh>
#endif
#if __has_include(<cub/block/block_scan.cuh>)
#include <cub/block/block_scan.cuh>
#endif
#if __has_include(<cub/block/block_store.cuh>)
#include <cub/block/block_store.cuh>
#endif
#if __has_include(<cub/grid/grid_even_share.cuh>)
#include <cub/grid/grid_even_share.cuh>
#endif
#if __has_include(<cub/grid/grid_mapping.cuh>)
#include <cub/grid/grid_mapping.cuh>
#endif
#if __has_include(<cub/grid/grid_queue.cuh>)
#include <cub/grid/grid_queue.cuh>
#endif
#if __has_include(<cub/thread/thread_load.cuh>)
#include <cub/thread/thread_load.cuh>
#endif
#if __has_include(<cub/thread/thread_operators.cuh>)
#include <cub/thread/thread_operators.cuh>
#endif
#if __has_include(<cub/thread/thread_reduce.cuh>)
#include <cub/thread/thread_reduce.cuh>
#endif
#if __has_include(<cub/thread/thread_scan.cuh>)
#include <cub/thread/thread_scan.cuh>
#endif
#if __has_include(<cub/thread/thread_store.cuh>)
#include <cub/thread/thread_store.cuh>
#endif
#if __has_include(<cub/warp/warp_exchange.cuh>)
#include <cub/warp/warp_exchange.cuh>
#endif
#if __has_include(<cub/warp/warp_load.cuh>)
#include <cub/warp/warp_load.cuh>
#endif
#if __has_include(<cub/warp/warp_merge_sort.cuh>)
#include <cub/warp/warp_merge_sort.cuh>
#endif
#if __has_include(<cub/warp/warp_reduce.cuh>)
#include <cub/warp/warp_reduce.cuh>
#endif
#if __has_include(<cub/warp/warp_scan.cuh>)
#include <cub/warp/warp_scan.cuh>
#endif
#if __has_include(<cub/warp/warp_store.cuh>)
#include <cub/warp/warp_store.cuh>
#endif
#if __has_include(<cub/iterator/arg_index_input_iterator.cuh>)
#include <cub/iterator/arg_index_input_iterator.cuh>
#endif
#if __has_include(<cub/iterator/cache_modified_input_iterator.cuh>)
#include <cub/iterator/cache_modified_input_iterator.cuh>
#endif
#if __has_include(<cub/iterator/cache_modified_output_iterator.cuh>)
#include <cub/iterator/cache_modified_output_iterator.cuh>
#endif
#if __has_include(<cub/iterator/tex_obj_input_iterator.cuh>)
#include <cub/iterator/tex_obj_input_iterator.cuh>
#endif
#if __has_include(<cub/util_debug.cuh>)
#include <cub/util_debug.cuh>
#endif
#if __has_include(<cub/util_device.cuh>)
#include <cub/util_device.cuh>
#endif
#if __has_include(<cub/util_ptx.cuh>)
#include <cub/util_ptx.cuh>
#endif
#if __has_include(<cub/util_temporary_storage.cuh>)
#include <cub/util_temporary_storage.cuh>
#endif
#if __has_include(<cub/util_type.cuh>)
#include <cub/util_type.cuh>
#endif
